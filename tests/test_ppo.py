"""PPO end to end: real CartPole simulators, real mpirun, a real HDF5 log."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import JOBS, ddrl, table

DIGEST = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")
PPO = ["--set", "algo.name=ppo", "--set", "acting.mode=a2c", "--set", "acting.n_sim=4",
       "--set", "acting.t_max=64", "--set", "optim.lr=1e-3", "--set", "optim.max_grad_norm=0.5",
       "--set", "eval.every=32", "--set", "run.max_frames=300000"]


@pytest.mark.newest_stack
def test_ppo_learns_cartpole_on_two_ranks_as_one_agent(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *PPO, ranks=2, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    digests = dict(DIGEST.findall(res.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, res.stdout
    evals = table(run_dir, "eval")
    assert evals["mean_return"].max() >= 400, evals["mean_return"]
    train = table(run_dir, "train")
    # 4 epochs x 4 minibatches of 2 ranks x 4 simulators x 64 steps: 128 per rank and update.
    assert (train["effective_batch"] == 128).all()
    assert np.isfinite(train["approx_kl"]).all() and (train["approx_kl"] < 1).all()
    assert ((train["clip_frac"] >= 0) & (train["clip_frac"] <= 1)).all()
    assert train["clip_frac"].max() > 0


def test_ppo_anneals_the_learning_rate_to_zero(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *PPO, "--set",
               "optim.lr_schedule=linear", "--set", "run.max_frames=20000", "--set",
               "eval.target=none", "--set", "run.log_every=1")
    assert res.returncode == 0, res.stderr[-3000:]
    train = table(run_dir, "train")
    lr = train["lr"]
    assert lr[0] < 1e-3 and (np.diff(lr) <= 0).all()
    expected = 1e-3 * (1 - train["frames"] / 20000)
    np.testing.assert_allclose(lr, np.maximum(expected, 0), atol=1e-6)
