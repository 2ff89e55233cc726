"""Parameter-server mode with real ranks under mpirun on CartPole: it learns, every rank ends
with the weights the servers hold, k-of-n and async account for every gradient, and a dead or
hung worker never leaves the job hanging."""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    DDRL,
    JOBS,
    NO_EVAL,
    ROOT,
    ddrl,
    env_for_tests,
    freeze_rank,
    mpirun,
    rank_pid,
    table,
    wait_for_updates,
)

from ddrl.distributed.ps import Layout, quorum
from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint

WORKER = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")
SERVER = re.compile(r"\[ddrl\] parameter server (\d+) \(rank \d+\) weights \[(\d+), (\d+)\).*"
                    r"final weights sha256 ([0-9a-f]+)")
# Learning rate 3e-3 solves CartPole in about 50k frames with 2-3 workers (1e-3: about 110k).
FAST = ["--set", "optim.lr=3e-3", "--set", "eval.every=50", "--set", "run.max_frames=300000"]


def test_quorum_and_slices():
    assert [quorum(a, 4) for a in (0.75, 1.0, 0.1, 3)] == [3, 4, 1, 3]
    assert quorum(0.7, 10) == 7 and quorum(0.9, 64) == 58  # at least 90%, despite float error
    for bad in (2.5, 5):
        with pytest.raises(DdrlError, match="sync.aggregate"):
            quorum(bad, 4)
    bounds = Layout.of(3, 7).bounds(1001)
    assert bounds[0][0] == 0 and bounds[-1][1] == 1001
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def test_k_of_n_and_async_need_ps_mode(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "sync.aggregate=0.5")
    assert res.returncode == 2
    assert "sync.aggregate != 1 (k-of-n) and sync.async = true need sync.mode = 'ps'" in res.stderr


def ps_args(servers: int, *sets: str) -> list[str]:
    return ["--set", "sync.mode=ps", "--set", f"sync.ps={servers}", "--set", "sync.timeout=30",
            *(arg for s in sets for arg in ("--set", s))]


def final_servers(run_dir: Path) -> np.ndarray:
    """Each server's last row: the figures of the workers' final exchange."""
    rows = table(run_dir, "servers")
    return np.array([rows[rows["server"] == s][-1] for s in np.unique(rows["server"])])


def check_final_weights(stdout: str, run_dir: Path, workers: int, servers: int) -> None:
    """Every worker printed the digest of the weights in rank 0's last checkpoint, and each
    server that of its slice of them."""
    weights = checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).weights
    digests = dict(WORKER.findall(stdout))
    assert sorted(map(int, digests)) == list(range(workers)), stdout
    full = hashlib.sha256(weights.tobytes()).hexdigest()
    assert all(full.startswith(d) for d in digests.values()), (full, digests)
    slices = SERVER.findall(stdout)
    assert sorted(int(s) for s, *_ in slices) == list(range(servers)), stdout
    assert sum(int(hi) - int(lo) for _, lo, hi, _ in slices) == weights.size
    for _, lo, hi, digest in slices:
        assert hashlib.sha256(weights[int(lo):int(hi)].tobytes()).hexdigest() == digest


def check_accounting(final: np.ndarray) -> None:
    """Each gradient a worker sent reached every server and was applied once or dropped."""
    for col in ("version", "received", "applied", "dropped", "sent"):
        assert len(set(final[col])) == 1, (col, final[col])  # all slices, same updates
    assert (final["applied"] + final["dropped"] == final["received"]).all()
    assert (final["received"] == final["sent"]).all()


@pytest.mark.parametrize("servers, workers, aggregate", [(1, 2, "1.0"), (2, 3, "2")])
def test_sync_learns_and_ranks_end_with_the_servers_weights(servers, workers, aggregate, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *FAST,
               *ps_args(servers, f"sync.aggregate={aggregate}"), ranks=servers + workers,
               timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stopped (target)" in res.stdout
    evals = table(run_dir, "eval")
    assert evals["mean_return"].max() >= 400
    check_final_weights(res.stdout, run_dir, workers, servers)
    final = final_servers(run_dir)
    check_accounting(final)
    k = quorum(float(aggregate), workers)
    train = table(run_dir, "train")
    assert (train["staleness"] == 0).all()
    # Exactly k per update, but for the last few, when leaving workers shrink the quorum.
    assert k * (final["version"][0] - workers) <= final["applied"][0] <= k * final["version"][0]
    if k == workers:
        assert (final["dropped"] == 0).all() and (train["contributors"] == workers).all()
        assert (table(run_dir, "ranks")["contributed"] == 1).all()
    else:
        # Of each round's n gradients the n - k last to arrive are too late.
        assert (final["dropped"] > 0).all()
        assert (train["contributors"] >= k).all()


def test_async_logs_staleness_and_applies_every_gradient_once(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *NO_EVAL,
               "--set", "run.max_frames=12000", *ps_args(2, "sync.async=true"), ranks=5,
               timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    check_final_weights(res.stdout, run_dir, 3, 2)
    final = final_servers(run_dir)
    check_accounting(final)
    assert (final["dropped"] == 0).all() and (final["applied"] == final["version"]).all()
    assert (final["staleness_sum"] > 0).all()
    train = table(run_dir, "train")
    assert train["staleness"].mean() > 0 and train["dropped"].sum() == 0
    ranks = table(run_dir, "ranks")
    assert set(ranks["rank"]) == {0, 1, 2} and ranks["contributed"].sum() > 0


def launch(run_dir: Path, *args: str) -> subprocess.Popen:
    cmd = [*mpirun(4), *DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir,
           *NO_EVAL, "--set", "run.log_every=1", *args]
    return subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_worker_ends_the_job(run_dir):
    """mpirun itself ends the whole job when a rank dies: nothing waits for the dead worker."""
    proc = launch(run_dir, *ps_args(1), "--set", "run.max_frames=100000000")
    try:
        wait_for_updates(proc, run_dir, 10)
        os.kill(rank_pid(run_dir, 2), signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "exited on signal 9" in out, out[-2000:]
    print(f"job ended {time.monotonic() - killed:.1f} s after the kill")


def test_hung_worker_is_left_out_and_the_job_ends(run_dir):
    """A worker that stops answering (SIGSTOP: mpirun does not notice) is left out after
    sync.timeout; the others finish the run, rank 0 saves it and ends the job."""
    # Long enough that the freeze (after 10 logged updates) lands mid-run on a fast CPU.
    proc = launch(run_dir, *ps_args(1, "sync.timeout=5"), "--set", "run.max_frames=100000")
    out = freeze_rank(proc, run_dir, 2)
    assert "worker rank 2 sent nothing for 5 s (sync.timeout); going on with 2 worker(s)" in out
    assert "stopped (frames)" in out, out[-3000:]
    assert "were left out; the run is saved; ending the job" in out
    assert proc.returncode != 0
    final = final_servers(run_dir)
    assert final["lost"][0] == 1
    check_accounting(final)
    train = table(run_dir, "train")
    assert train["contributors"][-1] == 2 and train["frames"][-1] >= 30000
    assert checkpoint.latest(run_dir / "checkpoints") is not None


@pytest.mark.parametrize("mode", ["sync.async=false", "sync.async=true"])
def test_non_finite_gradients_never_reach_the_servers_weights(run_dir, mode):
    """lr 1e99: the first update sends the weights to Inf, every gradient after is NaN; the
    servers drop each one (async mode would otherwise apply it), the workers stop."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *NO_EVAL, "--set", "optim.lr=1e99",
               "--set", "run.log_every=1", "--set", "run.max_frames=1000000", *ps_args(1, mode),
               ranks=3, timeout=180)
    assert res.returncode != 0
    assert "ddrl: error: the last 10 updates had NaN or Inf gradients" in res.stderr, res.stderr[-2000:]
    final = final_servers(run_dir)
    assert final["dropped"][0] >= 10
    train = table(run_dir, "train")
    assert train["nonfinite"].sum() >= 10
