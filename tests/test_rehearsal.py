"""Rehearsal (`sync.virtual_ranks`): k virtual ranks in one process end with the weights k
real ranks under mpirun end with, for each algorithm family, since their simulators, seeds
and gradient sums are the real ranks'."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import JOBS, NO_EVAL, ddrl, table
from test_multirank import final_weights

# Deterministic nodes, one TensorFlow thread per process (a rank's threads decide how its
# convolutions and matmuls round), a few dozen updates.
COMMON = (*NO_EVAL, "--set", "run.max_frames=4000", "--set", "acting.threads=1",
          "--set", "run.log_every=1", "--set", "run.tensorboard=false")
FAMILIES = {
    "a2c": (JOBS / "cartpole.toml", "acting.mode=a2c"),
    "ppo": (JOBS / "cartpole.toml", "acting.mode=a2c", "algo.name=ppo", "optim.lr_scaling=sqrt"),
    "vtrace": (JOBS / "cartpole.toml", "acting.mode=a2c", "algo.name=vtrace"),
    "dqn": (JOBS / "cartpole-dqn.toml", "dqn.prioritized=true", "dqn.double=true"),
    # The all-reduced mean clipped, not each rank's gradient: a clip that always bites.
    "ppo-clip-sync": (JOBS / "cartpole.toml", "acting.mode=a2c", "algo.name=ppo",
                      "optim.max_grad_norm=0.01", "optim.clip_scope=sync"),
}


def run(tmp_path, name: str, family: str, processes: int, virtual: int,
        *extra: str) -> tuple[str, np.ndarray]:
    job, *sets = FAMILIES[family]
    sets += extra
    out = tmp_path / name
    res = ddrl("train", job, "--out", out, *COMMON, *[a for s in sets for a in ("--set", s)],
               "--set", f"sync.virtual_ranks={virtual}", ranks=processes if processes > 1 else 0,
               timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    digests = set(final_weights(res.stdout).values())
    assert len(digests) == 1, res.stdout
    return digests.pop(), table(out, "train")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_virtual_ranks_end_with_the_weights_of_two_real_ones(family, tmp_path):
    virtual, virtual_train = run(tmp_path, "virtual", family, 1, 2)
    real, real_train = run(tmp_path, "real", family, 2, 1)
    assert virtual == real
    assert np.array_equal(virtual_train["loss"], real_train["loss"])
    assert (virtual_train["contributors"] == 2).all()
    assert np.array_equal(virtual_train["effective_batch"], real_train["effective_batch"])
    assert np.array_equal(virtual_train["lr"], real_train["lr"])  # sqrt(2) x for PPO


def test_four_ranks_as_four_virtual_two_by_two_and_four_real(tmp_path):
    """The pairwise sum of four virtual ranks is the all-reduce's order on four real ones."""
    one, _ = run(tmp_path, "1x4", "ppo", 1, 4)
    two, train = run(tmp_path, "2x2", "ppo", 2, 2)
    four, _ = run(tmp_path, "4x1", "ppo", 4, 1)
    assert one == two == four
    assert (train["contributors"] == 4).all()


def test_clipping_the_mean_is_not_clipping_each_rank(tmp_path):
    """Two ranks of different gradients: clipped one by one they weigh alike, clipped after
    the all-reduce they keep their proportions (fails on a code that ignores the scope)."""
    each, _ = run(tmp_path, "rank", "ppo-clip-sync", 1, 2, "optim.clip_scope=rank")
    mean, _ = run(tmp_path, "sync", "ppo-clip-sync", 1, 2)
    assert each != mean


def test_fused_virtual_ranks_train_the_same_job(tmp_path):
    """`sync.virtual_fused`: the same updates within float rounding, computed in one call (the
    logged norm is then the ranks' mean gradient's, not rank 0's). Twenty updates' losses
    agree: the rounding drifts by under 1e-6 there (too little to flip a sampled action), a
    wrong update, moment or minibatch is far off."""
    _, plain = run(tmp_path, "plain", "ppo-clip-sync", 1, 2)
    _, fused = run(tmp_path, "fused", "ppo-clip-sync", 1, 2, "sync.virtual_fused=true")
    assert len(plain) >= 20
    np.testing.assert_allclose(fused["loss"][:20], plain["loss"][:20], rtol=1e-4)
    assert (fused["contributors"] == 2).all()
    assert abs(fused["grad_norm"][0] - plain["grad_norm"][0]) > 1e-3 * plain["grad_norm"][0]


@pytest.fixture(scope="module")
def projection_runs(tmp_path_factory) -> Path:
    """The runs both projection tests read: one real rank and two fused virtual ones, each to
    CartPole 60 (their frames to it are a rank count's point); a two-rank rehearsal unfused and
    a real rank with another rollout, short runs whose speed alone matters."""
    root = tmp_path_factory.mktemp("projection")

    def train(name: str, *settings: str, frames: int = 20000, target: bool = False) -> None:
        ev = ("--set", "eval.every=20", "--set", "eval.target=60") if target else NO_EVAL
        res = ddrl("train", JOBS / "cartpole.toml", "--out", root / name, "--set",
                   "acting.mode=a2c", "--set", f"run.max_frames={frames}", "--set",
                   "run.tensorboard=false", *ev, *[a for kv in settings for a in ("--set", kv)],
                   timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
    train("k1", frames=100000, target=True)
    train("k2", "sync.virtual_ranks=2", "sync.virtual_fused=true", frames=100000, target=True)
    train("rehearsed", "sync.virtual_ranks=2")
    train("other", "acting.t_max=10")
    return root


@pytest.mark.xdist_group("projection")
def test_the_projection_prints_its_inputs_and_refuses_past_the_largest_measured_batch(
        projection_runs):
    runs = ("--runs", projection_runs / "k1", projection_runs / "k2")
    res = ddrl("bench", "project", JOBS / "cartpole.toml", *runs, "--nodes", "1", "2", "4",
               "--cores-per-node", "1", "--link", "1gbit", timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "1 ranks: 1/1 reached" in out and "2 ranks: 1/1 reached" in out, out
    assert "frames/s per core, median of 1 (run(s) of real ranks)" in out, out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:5].strip().isdigit()}
    assert rows["1"].endswith("measured") and rows["2"].endswith("measured"), out
    # One seed a count: the seeds' spread is that seed's minutes.
    low, high = rows["2"].split()[-2].split("-")
    assert low == high == rows["2"].split()[-3], out
    assert "beyond the largest measured batch (2 ranks)" in rows["4"], out
    extrapolated = ddrl("bench", "project", JOBS / "cartpole.toml", *runs, "--nodes", "4",
                        "--cores-per-node", "1", "--extrapolate", timeout=120)
    assert "EXTRAPOLATED" in extrapolated.stdout, extrapolated.stdout
    # Runs that missed the target: their budget bounds the frames from below, and so the minutes.
    missed = ddrl("bench", "project", JOBS / "cartpole.toml", *runs, "--nodes", "1", "2",
                  "--cores-per-node", "1", "--link", "1gbit", "--target", "100000", timeout=120)
    assert missed.returncode == 0, missed.stderr
    assert "1 ranks: 0/1 reached, median > 0." in missed.stdout, missed.stdout
    rows = [line for line in missed.stdout.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == 2 and all(r.endswith("measured, a lower bound") and "> " in r
                                  for r in rows), missed.stdout


@pytest.mark.xdist_group("projection")
def test_the_projection_takes_a_rank_speed_only_from_real_ranks_alike(projection_runs):
    """A rehearsal's virtual ranks share an update's all-reduce and optimizer step (fused, its
    gradient call too), which real ranks each pay: its frames/s is no rank's. A rank's speed
    comes from real ranks with the same rollout, epochs and minibatches (fails on a code that
    took an unfused rehearsal's rate)."""
    project = ("bench", "project", JOBS / "cartpole.toml", "--runs", projection_runs / "k2",
               "--nodes", "2", "--cores-per-node", "1")
    for speed_runs in ((), ("--speed-runs", projection_runs / "other")):
        refused = ddrl(*project, *speed_runs, timeout=120)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert refused.stderr.strip().splitlines()[-1].startswith(
            "ddrl: error: no run gives a rank's frames/s"), refused.stderr
    assert "rollout 80, epochs 4, minibatches 4 (run(s) of real ranks): alike no measured rank " \
        "count, not used" in refused.stdout, refused.stdout
    given = ddrl(*project, "--fps-per-core", "5000", timeout=120)
    assert given.returncode == 0, given.stderr
    assert "frames/s not measured (no run of real ranks alike)" in given.stdout, given.stdout
    wrong = ddrl(*project, "--speed-runs", projection_runs / "rehearsed", timeout=120)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert "a rehearsal (sync.virtual_ranks)" in wrong.stderr.strip().splitlines()[-1]
    speed = ddrl(*project, "--speed-runs", projection_runs / "k1", timeout=120)
    assert speed.returncode == 0, speed.stderr
    assert re.search(r"    2 ranks: .*; a rank \(rollout 40, epochs 4, minibatches 4\): "
                     r"[\d,]+ frames/s per core, median of 1 \(run\(s\) of real ranks\)",
                     speed.stdout), \
        speed.stdout
