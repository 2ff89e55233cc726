"""DQN end to end: it learns CartPole in each execution mode, across ranks it is one agent,
and concurrent training reproduces whatever the threads' timing."""
from __future__ import annotations

import re
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import DDRL, JOBS, NO_EVAL, RAINBOW, ROOT, assert_solved, ddrl, env_for_tests, table

from ddrl.loop.trainer import EXIT_SIGNALLED
from ddrl.rundir import checkpoint

DQN_JOB = JOBS / "cartpole-dqn.toml"
WEIGHTS = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")


@pytest.mark.parametrize("mode", [("dqn.concurrent=false", "dqn.synchronized=true"), RAINBOW])
def test_dqn_learns_cartpole(mode, run_dir):
    """Greedy evaluation reaches 400 within the job's 100,000 frames: standard DQN with 4
    synchronized samplers, and epsilon-Rainbow (distributional, dueling, prioritized).
    Concurrent training is the same learner on other threads: the test below checks that it
    trains on the very data of a given seed, whatever the threads' timing."""
    sets = [a for m in mode for a in ("--set", m)]
    res = ddrl("train", DQN_JOB, "--out", run_dir, *sets, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[ddrl] replay memory: 50,000 frames" in res.stdout
    assert_solved(run_dir, " ".join(mode))
    assert "stopped (target)" in res.stdout
    train = table(run_dir, "train")
    assert np.isfinite(train["loss"]).all() and (train["policy_lag"] >= 0).all()
    # The run ends on a checkpoint of its last update.
    assert 0 <= checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update - train["update"][-1] < 50


def test_dqn_concurrent_on_two_ranks_is_one_reproducible_agent(tmp_path):
    """Every minibatch gradient is summed across ranks (the same weights on both), and two
    runs of concurrent training with unsynchronized samplers train on the same data."""
    sets = ["--set", "dqn.concurrent=true", "--set", "dqn.synchronized=false",
            "--set", "dqn.samplers=2", "--set", "dqn.target_period=200",
            "--set", "run.max_frames=6000", "--set", "run.log_every=1", *NO_EVAL]
    runs = [ddrl("train", DQN_JOB, "--out", tmp_path / name, *sets, ranks=2, timeout=300)
            for name in ("a", "b")]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    digests = [dict(WEIGHTS.findall(r.stdout)) for r in runs]
    assert sorted(digests[0]) == ["0", "1"] and len(set(digests[0].values())) == 1, digests
    assert digests[0] == digests[1]
    a, b = table(tmp_path / "a", "train"), table(tmp_path / "b", "train")
    assert len(a) == len(b) > 100
    assert np.array_equal(a["loss"], b["loss"])
    assert (a["effective_batch"] == 2 * 64).all()


@pytest.mark.parametrize("sets", [
    ("dqn.prepopulate=100000000",),
    ("dqn.concurrent=true", "dqn.target_period=100000000", "dqn.train_period=1"),
], ids=["prepopulation", "concurrent-period"])
def test_a_stop_signal_ends_a_long_sampling_phase(sets, run_dir):
    """SIGTERM (scancel) while the memory is prepopulated, or while a concurrent sampler thread
    plays a target period (both here: for ever), stops the run promptly, checkpointed, with
    the signal's exit status."""
    cmd = [*DDRL, "train", DQN_JOB, "--out", run_dir, *NO_EVAL, "--set", "run.progress_seconds=1",
           *(a for s in sets for a in ("--set", s))]
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # A long prepopulation says how far it is; the signal comes once it has said so.
    progress = re.compile(r"\[ddrl\] rank 0 prepopulating the replay memory: [\d,]+ of "
                          r"100,000,000 transitions \(0%\), [\d,]+/s, \d+:\d\d left$")
    try:
        for line in proc.stdout:
            if (progress.match(line) if sets[0] == "dqn.prepopulate=100000000"
                    else "[ddrl] replay memory" in line):
                break
        else:
            raise AssertionError("the run ended before its sampling phase")
        time.sleep(3.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_SIGNALLED, out[-2000:]
    assert "stopped (signal) after" in out, out[-2000:]
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update >= 1


def test_a_saved_replay_memory_without_some_of_its_arrays_is_refused_whole(run_dir):
    """A replay file that lacks arrays (written by another version, or edited): the resume
    says so in a line and prepopulates a new memory; it ended in a KeyError after the memory
    had already been replaced (the actors' `credit`, the prioritized memory's own
    `max_priority`)."""
    sets = ["--set", "dqn.save_replay=true", "--set", "dqn.prioritized=true", *NO_EVAL]
    first = ddrl("train", DQN_JOB, "--out", run_dir, *sets, "--set", "run.max_frames=3000",
                 timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    path = run_dir / "checkpoints" / "replay-rank0.npz"
    saved = checkpoint.read_arrays(path)
    del saved["credit"], saved["max_priority"]
    checkpoint.write_arrays(path, saved)
    again = ddrl("train", run_dir / "config.toml", "--out", run_dir, "--resume", *sets,
                 "--set", "run.max_frames=5000", timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "replay memory not restored (credit, max_priority missing)" in again.stderr, \
        again.stderr[-2000:]
    assert "Traceback" not in again.stderr


def test_a_resumed_run_takes_up_each_ranks_saved_replay_memory(run_dir):
    """`dqn.save_replay`: each rank's memory is saved with the final checkpoint and restored by
    --resume, which then trains at once instead of prepopulating (1,000 frames of random play
    per rank in this job). A prioritized memory's save and resume: tests/test_central.py."""
    sets = ["--set", "dqn.save_replay=true", "--set", "run.log_every=1", *NO_EVAL]
    first = ddrl("train", DQN_JOB, "--out", run_dir, *sets, "--set", "run.max_frames=6000",
                 ranks=2, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    # Said before the (possibly long) write and after it.
    assert "[ddrl] saving the replay memory: " in first.stdout
    assert "[ddrl] replay memory saved" in first.stdout
    ckpt = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    for rank in (0, 1):
        saved = checkpoint.read_arrays(run_dir / "checkpoints" / f"replay-rank{rank}.npz")
        assert int(saved["update"]) == ckpt.update and saved["acted"].sum() > 1000

    again = ddrl("train", run_dir / "config.toml", "--out", run_dir, "--resume", *sets,
                 "--set", "run.max_frames=10000", ranks=2, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[ddrl] replay memory restored" in again.stdout
    assert "not restored" not in again.stderr
    train = table(run_dir, "train")
    resumed = train[train["update"] > ckpt.update]
    # Standard mode takes one round of 4 samplers per 4 updates on each of 2 ranks: 2 frames
    # per update. A prepopulation would add 2,000 frames before the first of them.
    assert resumed["frames"][0] - ckpt.frames <= 2 * 50
