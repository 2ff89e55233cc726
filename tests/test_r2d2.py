"""R2D2 end to end: a recurrent Q network trained on replayed sequences, on two ranks as one
agent, and with central inference (the simulators' recurrent states and the memory of
sequences on the learner, actors without a network)."""
from __future__ import annotations

import re

import numpy as np
from conftest import JOBS, NO_EVAL, ddrl, table
from test_central import check_actors

from ddrl.rundir import checkpoint

R2D2_JOB = JOBS / "cartpole-r2d2.toml"
WEIGHTS = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")
SEQUENCES = "sequences of 10 burn-in + 20 + 3 steps every 10"


def test_r2d2_on_two_ranks_is_one_agent(run_dir):
    """Every minibatch of sequences gives a gradient summed across ranks: the same weights on
    both; each rank's memory holds its own simulators' sequences."""
    res = ddrl("train", R2D2_JOB, "--out", run_dir, "--set", "run.max_frames=4000",
               "--set", "run.log_every=1", *NO_EVAL, ranks=2, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"[ddrl] replay memory: 50,000 frames in 4 stream(s), {SEQUENCES}" in res.stdout
    digests = dict(WEIGHTS.findall(res.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, digests
    train = table(run_dir, "train")
    assert len(train) > 100 and np.isfinite(train["loss"]).all()
    assert (train["effective_batch"] == 2 * 32).all()


def test_central_r2d2_keeps_states_and_sequences_on_the_learner_and_resumes_them(run_dir):
    """SEED's R2D2: the learner infers for every remote simulator with its recurrent state,
    stores their sequences with those states and samples them by priority; the memory (states
    and priorities in it) is saved and taken up by --resume."""
    sets = ("--set", "sync.mode=central", "--set", "dqn.prioritized=true",
            "--set", "dqn.save_replay=true", *NO_EVAL)
    res = ddrl("train", R2D2_JOB, "--out", run_dir, *sets, "--set", "run.max_frames=4000",
               ranks=3, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # 2 actor ranks x central.groups 2 x acting.n_sim 10.
    assert f"[ddrl] replay memory: 50,000 frames in 40 stream(s), {SEQUENCES}" in res.stdout
    assert "sync central" in res.stdout and "stopped (frames)" in res.stdout
    check_actors(run_dir, res.stdout, [1, 2])
    saved = checkpoint.read_arrays(run_dir / "checkpoints" / "replay-rank0.npz")
    # Sequence starts stored with states, and priorities learned for some of them.
    assert saved["steps"].sum() > 3000 and np.abs(saved["states"]).sum() > 0
    assert len(np.unique(saved["leaves"][saved["leaves"] > 0])) > 20
    again = ddrl("train", run_dir / "config.toml", "--out", run_dir, "--resume", *sets,
                 "--set", "run.max_frames=6000", ranks=3, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[ddrl] replay memory restored" in again.stdout and "not restored" not in again.stderr
    train = table(run_dir, "train")
    assert len(train) and np.isfinite(train["loss"]).all()
