"""The batch scripts on a real 2-node Slurm cluster: one slurmd per simulated host
(tests/slurm_cluster.py, ddrl/bench/simhosts.py), `srun --mpi=pmix` ranks on both hosts talking
over the link between them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import NO_EVAL
from slurm_cluster import slurm_hosts_cluster  # noqa: F401  (the fixture)
from test_slurm import CARTPOLE, SLURM, warn_and_resume

from ddrl.rundir import checkpoint

TWO_NODES = ("--nodes=2", "--ntasks-per-node=1")
# One worker of `pytest -n` (Makefile) takes the whole module: one 2-host cluster.
pytestmark = pytest.mark.xdist_group("slurm_hosts")


def test_two_node_job_runs_one_rank_per_host(slurm_hosts_cluster, tmp_path):
    cluster = slurm_hosts_cluster
    out = tmp_path / "run"
    before = cluster.hosts.traffic()
    job = cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                         "--set", "acting.mode=a2c", "--set", "run.max_frames=8000", *NO_EVAL,
                         options=TWO_NODES)
    [result] = cluster.wait(job, timeout=200)
    after = cluster.hosts.traffic()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), result.text()
    assert "on h[1-2]" in result.text() or "on h1,h2" in result.text(), result.text()
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        assert (f.attrs["world_size"], f.attrs["nodes"]) == (2, 2)
    ckpt = checkpoint.load(checkpoint.latest(out / "checkpoints"))
    # Each update's gradient crossed h2's link both ways.
    received, sent = (after["h2"][i] - before["h2"][i] for i in (0, 1))
    assert min(received, sent) >= ckpt.update * ckpt.weights.nbytes, (received, sent)


def test_central_mode_runs_as_a_heterogeneous_job(slurm_hosts_cluster, tmp_path):
    """`ddrl slurm` of a central-mode job: a learner component and an actor component, one
    MPI world across them (srun --het-group, PMIx); Slurm's warning checkpoints, the job
    requeues and the resume completes the run in one log."""
    cluster = slurm_hosts_cluster
    out = tmp_path / "run"
    printed = subprocess.run(
        [sys.executable, "-m", "ddrl", "slurm", str(CARTPOLE), "--out", str(out),
         "--set", "sync.mode=central", "--set", "algo.name=vtrace",
         "--set", "run.max_frames=60000", *NO_EVAL, "--nodes", "1", "--tasks-per-node", "2",
         "--cpus-per-task", "1", "--learner-cpus", "1"],
        capture_output=True, text=True, check=True)
    script = tmp_path / "central.sbatch"
    script.write_text(printed.stdout)
    job = cluster.submit(script)
    deadline = time.monotonic() + 180
    while checkpoint.latest(out / "checkpoints") is None and not (out / "log.h5").exists():
        assert time.monotonic() < deadline, cluster.records(job)
        time.sleep(0.5)
    time.sleep(3)
    cluster.run("scancel", "--signal=USR1", "--batch", job)
    results = cluster.wait(job, timeout=300)
    text = results[0].text()
    assert all((r.state, r.exit_code) == ("COMPLETED", 0) for r in results), text
    assert "(2 components)" in text and f"requeueing job {job}" in text, text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        ranks, starts, train = f["ranks"][:], f["starts"][:], f["train"][:]
    assert set(ranks["rank"]) >= {1, 2}  # the actor component's two tasks
    assert starts["restart"].tolist()[:2] == [0, 1]
    assert np.all(np.diff(train["update"]) > 0)
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).frames >= 60000


def test_warning_signal_requeues_and_resumes_across_nodes(slurm_hosts_cluster, tmp_path):
    _, _, starts = warn_and_resume(slurm_hosts_cluster, tmp_path / "run", TWO_NODES)
    assert list(starts["nodes"][:2]) == [2, 2] and list(starts["restart"][:2]) == [0, 1], starts


def kill_host(cluster, name: str) -> None:
    """Every process of a simulated host (its slurmd, step daemons and ranks): a lost node."""
    host = next(h for h in cluster.hosts.hosts if h.name == name)
    pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                          text=True).stdout.split()
    assert pids, f"nothing runs on {name}"
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def lose_a_host(cluster, out: Path, env: dict[str, str] | None = None) -> str:
    """A 2-node job loses host h2 after its first checkpoint: the batch script restarts the
    run from the last checkpoint with one rank on h1 and it completes. Leaves the cluster
    with one node; returns the job's output."""
    # The run ends on its training time (counted across restarts), whatever the CPU's speed.
    job = cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                         "--set", "run.max_minutes=0.25", "--set", "run.checkpoint_minutes=0.1",
                         *NO_EVAL, options=TWO_NODES, env=env)
    deadline = time.monotonic() + 180
    while checkpoint.latest(out / "checkpoints") is None:
        assert time.monotonic() < deadline and cluster.state(job) in ("PENDING", "RUNNING")
        time.sleep(0.5)
    kill_host(cluster, "h2")
    lost_at = time.monotonic()
    before = checkpoint.load(checkpoint.latest(out / "checkpoints"))
    [result] = cluster.wait(job, timeout=420)
    text = result.text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text
    assert "restart 1 of 3" in text, text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        starts = f["starts"][:]
        rows = f["train"][:]
    # The restart ran on the host left: one rank where there were two.
    assert list(starts["world_size"]) == [2, 1] and list(starts["nodes"]) == [2, 1], starts
    assert starts["update"][1] >= before.update > 0
    assert np.all(np.diff(rows["update"]) > 0)
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).wall_time >= 15
    restarted = rows[rows["restart"] == 1]
    print(f"host lost at frame ~{before.frames}; resumed from frame {starts['frames'][1]} "
          f"(update {starts['update'][1]}); job done {time.monotonic() - lost_at:.0f} s after "
          f"the loss; {len(restarted)} rows after the restart")
    return text


# Last in this module: it leaves the cluster with one node.
def test_a_lost_host_restarts_the_job_on_the_host_left(slurm_hosts_cluster, tmp_path):
    lose_a_host(slurm_hosts_cluster, tmp_path / "run")

