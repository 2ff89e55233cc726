"""Several real ranks under mpirun: identical weights, equivalent learning, world checks."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import (
    DDRL,
    JOBS,
    NO_EVAL,
    ROOT,
    cpu_seconds,
    ddrl,
    env_for_tests,
    mpirun,
    rank_pid,
    root_attrs,
    run_with_a_frozen_rank,
    table,
    wait_stopped,
)

from ddrl.rundir import checkpoint

WEIGHTS = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")


def final_weights(stdout: str) -> dict[int, str]:
    return {int(r): digest for r, digest in WEIGHTS.findall(stdout)}


@pytest.mark.parametrize("backend, ranks", [
    pytest.param("mpi", 2, marks=pytest.mark.newest_stack), ("mpi", 3), ("horovod", 2), ("horovod", 3)])
def test_weights_identical_on_every_rank(backend, ranks, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", f"sync.backend={backend}",
               "--set", "run.max_frames=6000", *NO_EVAL, ranks=ranks, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    digests = final_weights(res.stdout)
    assert sorted(digests) == list(range(ranks)), res.stdout
    assert len(set(digests.values())) == 1, digests
    train = table(run_dir, "train")
    assert len(train) > 5
    assert (train["contributors"] == ranks).all()
    assert (train["effective_batch"] == ranks * 32).all()
    ranks_rows = table(run_dir, "ranks")
    assert set(ranks_rows["rank"]) == set(range(ranks))
    assert (ranks_rows["dp_per_s"] > 0).all()
    assert root_attrs(run_dir)["world_size"] == ranks


def frames_to_solve(run_dir) -> float:
    evals = table(run_dir, "eval")
    solved = evals[evals["mean_return"] >= 400]
    return float(solved["frames"][0]) if len(solved) else np.inf


def test_a2c_two_ranks_match_one_rank_with_double_batch(tmp_path):
    """Same algorithm, same effective batch (2 ranks x 4 simulators x 5 steps vs 1 rank x 8
    x 5): both learn CartPole, and the frames they need agree within a factor of 3 (single
    seeds of CartPole vary by about 2x on their own)."""
    common = ["--set", "acting.mode=a2c", "--set", "run.max_frames=300000", "--set", "eval.every=50"]
    one = ddrl("train", JOBS / "cartpole.toml", "--out", tmp_path / "one", *common,
               "--set", "acting.n_sim=8", timeout=240)
    two = ddrl("train", JOBS / "cartpole.toml", "--out", tmp_path / "two", *common,
               "--set", "acting.n_sim=4", ranks=2, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    f1, f2 = frames_to_solve(tmp_path / "one"), frames_to_solve(tmp_path / "two")
    print(f"frames to solve: 1 rank x 8 sims {f1:,.0f}, 2 ranks x 4 sims {f2:,.0f}")
    assert np.isfinite(f1) and np.isfinite(f2)
    assert 1 / 3 <= f1 / f2 <= 3
    assert (table(tmp_path / "one", "train")["effective_batch"] == 40).all()
    assert (table(tmp_path / "two", "train")["effective_batch"] == 40).all()


def test_a2c_is_reproducible_on_a_fixed_world(tmp_path):
    common = ["--set", "acting.mode=a2c", "--set", "run.max_frames=4000", *NO_EVAL,
              "--set", "run.log_every=1"]
    runs = [ddrl("train", JOBS / "cartpole.toml", "--out", tmp_path / name, *common, ranks=2,
                 timeout=180) for name in ("a", "b")]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    a, b = table(tmp_path / "a", "train"), table(tmp_path / "b", "train")
    assert len(a) == len(b) > 10
    assert np.array_equal(a["loss"], b["loss"])
    assert final_weights(runs[0].stdout) == final_weights(runs[1].stdout)


def test_a_frozen_rank_ends_an_allreduce_job_after_sync_timeout(run_dir):
    """Rank 1 stops itself after 1000 updates (seconds into the run, after the first
    checkpoints), as a node hung in its own work would (alive to
    mpirun, silent to the others): the waiting ranks do not spin a core, and after
    sync.timeout they name it, in one line."""
    cmd = [*mpirun(3), *DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, *NO_EVAL,
           "--set", "run.log_every=1", "--set", "sync.timeout=15",
           "--set", "run.max_frames=100000000", "--set", "run.checkpoint_minutes=0.01",
           "--set", "debug.freeze_rank=1", "--set", "debug.freeze_update=1000"]
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frozen = None
    try:
        frozen, waiting = rank_pid(run_dir, 1, wait=120), rank_pid(run_dir, 0)
        wait_stopped(frozen)
        # CPU time, which the machine's load does not inflate; a busy-polling wait is 1.0.
        time.sleep(2.0)
        used, start = cpu_seconds(waiting), time.monotonic()
        time.sleep(5.0)
        share = (cpu_seconds(waiting) - used) / (time.monotonic() - start)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if frozen is not None:
            os.kill(frozen, signal.SIGKILL)
    print(f"rank 0 used {share:.1%} of a core while it waited")
    assert share < 0.25, f"rank 0 used {share:.0%} of a core while it waited"
    assert proc.returncode != 0
    assert out.count("ddrl: error:") == 1, out[-3000:]
    assert re.search(r"ddrl: error: rank 0 waited 15 s \(sync.timeout\) in all-reduce 1001 for "
                     r"rank 1, which never joined", out), out[-3000:]
    # What was written before the freeze is intact.
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update >= 1
    assert len(table(run_dir, "train")) >= 10


def test_a_rank_frozen_after_its_last_update_ends_the_job_after_rank_0_saved(run_dir):
    """Rank 1 stops itself after the last update, before the final barrier: rank 0, with its
    final checkpoint written, waits sync.timeout for it and ends the job in one line instead
    of holding the allocation for ever."""
    cmd = [*mpirun(2), *DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, *NO_EVAL,
           "--set", "sync.timeout=10", "--set", "run.max_frames=20000",
           "--set", "debug.freeze_rank=1", "--set", "debug.freeze_update=-2"]
    code, out = run_with_a_frozen_rank(cmd, run_dir, 1)
    assert code != 0
    assert out.count("ddrl: error:") == 1, out[-3000:]
    assert "ddrl: error: rank 0 waited 10 s (sync.timeout) for the other ranks at the end of " \
        "the run: one is frozen or lost" in out, out[-3000:]
    latest = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    assert latest.frames >= 20000


@pytest.mark.parametrize("stage, waited", [
    # Before MPI's initialisation (a hung import from a shared filesystem): the other rank
    # waited in MPI_Init or the world's first collectives for ever, spinning a core.
    (-4, "for the job's ranks to start MPI and meet: one is frozen or lost before it; ending "
         "the job"),
    # Before the initial weights are shared: the other rank, inside a blocking broadcast,
    # would spin a core forever.
    (-1, "in a start-up collective for rank 1, which never joined: frozen or lost; ending the "
         "job")])
def test_a_rank_frozen_at_start_up_ends_the_job_in_one_line(run_dir, stage, waited):
    cmd = [*mpirun(2), *DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, *NO_EVAL,
           "--set", "sync.timeout=5", "--set", "sync.startup_timeout=20",
           "--set", "debug.freeze_rank=1", "--set", f"debug.freeze_update={stage}"]
    code, out = run_with_a_frozen_rank(cmd, run_dir, 1)
    assert code != 0
    assert out.count("ddrl: error:") == 1, out[-3000:]
    assert ("ddrl: error: rank 0 waited 20 s (sync.timeout, at least sync.startup_timeout = 20 s "
            f"at start-up) {waited}") in out, out[-3000:]


def test_a_rank_that_sees_an_older_checkpoint_resumes_with_rank_0s_counters(run_dir, tmp_path):
    """A stale NFS cache: on resume, rank 1 sees only an older checkpoint (its own mount of
    the run's checkpoints, bound over an old copy). Rank 0's counters go to every rank, so
    both stop at the same frame; with its own, rank 1 trained on alone after rank 0 had
    stopped, and the job ended in the all-reduce's watchdog."""
    sets = [*NO_EVAL, "--set", "acting.mode=a2c", "--set", "sync.timeout=20"]
    first = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *sets,
                 "--set", "run.max_frames=4000", ranks=2, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    old = tmp_path / "old-checkpoints"
    subprocess.run(["cp", "-a", str(run_dir / "checkpoints"), str(old)], check=True)
    second = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume", *sets,
                  "--set", "run.max_frames=8000", ranks=2, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    newer = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    assert newer.frames > checkpoint.load(checkpoint.latest(old)).frames
    train = [*DDRL, "train", str(JOBS / "cartpole.toml"), "--out", str(run_dir), "--resume",
             *sets, "--set", "run.max_frames=12000"]
    stale = ["unshare", "--mount", "sh", "-c",
             'mount --bind "$0" "$1" && shift && exec "$@"', str(old), str(run_dir / "checkpoints"),
             *train]
    launcher = mpirun(1)[:1] + mpirun(1)[3:]  # mpirun and its flags, without `-n 1`
    res = subprocess.run([*launcher, "-n", "1", *train, ":", "-n", "1", *stale],
                         capture_output=True, text=True, timeout=240, cwd=ROOT,
                         env=env_for_tests())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    starts = table(run_dir, "starts")
    assert starts["frames"][-1] == newer.frames
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).frames >= 12000
