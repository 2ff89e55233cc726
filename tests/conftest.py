"""Shared helpers: run the real `ddrl` CLI (optionally under mpirun) and read real HDF5 logs."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ddrl.distributed.launch import mpirun_command

# Every ddrl process the tests start skips Python's teardown (ddrl/cli.py): about a second a
# process, minutes over the suite.
os.environ.setdefault("DDRL_FAST_EXIT", "1")

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"
DDRL = [sys.executable, "-m", "ddrl"]
# No evaluations, and so no target (a target with no evaluations is refused).
NO_EVAL = ("--set", "eval.episodes=0", "--set", "eval.target=none")
# epsilon-Rainbow's options on CartPole, whose returns (1 per step, gamma 0.99) lie in [0, 100].
RAINBOW = ("dqn.atoms=51", "dqn.v_min=0", "dqn.v_max=100", "dqn.dueling=true",
           "dqn.prioritized=true")


def mpirun(ranks: int) -> list[str]:
    # Unbound and oversubscribed: tests start more ranks than this machine has cores.
    return mpirun_command(ranks, bind=False)


def env_for_tests() -> dict[str, str]:
    env = dict(os.environ)
    # Tests must not inherit a surrounding Slurm job's task count (the world check would fire).
    for var in [v for v in env if v.startswith(("SLURM_", "OMPI_", "PMIX_"))]:
        env.pop(var)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ddrl(*args: str, timeout: float = 300, env: dict | None = None, ranks: int = 0
         ) -> subprocess.CompletedProcess:
    cmd = (mpirun(ranks) if ranks else []) + DDRL + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env or env_for_tests())


def table(run_dir: Path, name: str) -> np.ndarray:
    with h5py.File(run_dir / "log.h5", "r", swmr=True) as f:
        return f[name][:]


def root_attrs(run_dir: Path) -> dict:
    with h5py.File(run_dir / "log.h5", "r", swmr=True) as f:
        return dict(f.attrs)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def assert_solved(run_dir: Path, label: str, score: float = 400.0) -> None:
    """Some evaluation reached `score` (CartPole's check that a run learned)."""
    evals = table(run_dir, "eval")
    solved = evals[evals["mean_return"] >= score]
    assert len(solved), f"{label}: best eval {evals['mean_return'].max()}"
    print(f"{label}: solved at {solved['frames'][0]} frames, {solved['wall_time'][0]:.1f} s")


def rank_pid(run_dir: Path, rank: int, wait: float = 0.0,
             rank_var: str = "OMPI_COMM_WORLD_RANK") -> int:
    """The process of one rank of the job that writes to run_dir (waiting up to `wait`
    seconds for it to start); rank_var names the launcher's rank variable (srun: SLURM_PROCID)."""
    deadline = time.monotonic() + wait
    while True:
        for proc in Path("/proc").iterdir():
            try:
                if str(run_dir) in (proc / "cmdline").read_text():
                    env = (proc / "environ").read_bytes().split(b"\0")
                    if f"{rank_var}={rank}".encode() in env:
                        return int(proc.name)
            except (OSError, ValueError):
                continue
        if time.monotonic() > deadline:
            raise AssertionError(f"no process of rank {rank}")
        time.sleep(0.2)


def wait_for_updates(proc: subprocess.Popen, run_dir: Path, updates: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "log.h5").exists():
            with h5py.File(run_dir / "log.h5", "r", swmr=True) as f:
                if f["train"].shape[0] >= updates:
                    return
        time.sleep(0.5)
    raise AssertionError("the run made no progress")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def freeze_rank(proc: subprocess.Popen, run_dir: Path, rank: int) -> str:
    """SIGSTOP one rank once the job has logged 10 updates (alive to mpirun, silent to the
    others); the job's output once it has ended, the frozen rank killed in any case."""
    pid = None
    try:
        wait_for_updates(proc, run_dir, 10)
        pid = rank_pid(run_dir, rank)
        os.kill(pid, signal.SIGSTOP)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return out


def run_with_a_frozen_rank(cmd: list, run_dir: Path, rank: int) -> tuple[int, str]:
    """A job one of whose ranks stops itself (SIGSTOP, `debug.freeze_*`): its exit code and
    output once the others have ended it; the frozen process is killed however it ends."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frozen = None
    try:
        frozen = rank_pid(run_dir, rank, wait=120)
        wait_stopped(frozen)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
    return proc.returncode, out


def wait_stopped(pid: int, timeout: float = 120) -> None:
    """Until the process is stopped (state T), as a rank that froze itself is."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} never stopped")
        time.sleep(0.2)
