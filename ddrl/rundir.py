"""Run directories: where a run's log and checkpoints go, and whether a new run or a resume
may use one."""
from __future__ import annotations

import datetime
import fcntl
import os
import socket
import tempfile
from pathlib import Path
from typing import IO

from ddrl import checkpoint
from ddrl.errors import DdrlError
from ddrl.output import say


def default_run_dir(job: str) -> Path:
    stem = Path(job).stem
    env = os.environ
    if "SLURM_ARRAY_JOB_ID" in env:
        tag = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    elif "SLURM_JOB_ID" in env:
        tag = env["SLURM_JOB_ID"]
    else:
        tag = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stem}-{tag}"


def prepare(run_dir: Path, resume: bool, loud: bool) -> checkpoint.Checkpoint | None:
    """The checkpoint to resume from; refuses to write over an existing run's log."""
    if resume:
        path, ckpt, damaged = checkpoint.latest_intact(run_dir / "checkpoints")
        if ckpt is None:
            detail = f" ({len(damaged)} damaged: {damaged[0]})" if damaged else ""
            raise DdrlError(f"--resume: no intact checkpoint in {run_dir / 'checkpoints'}{detail}")
        for line in damaged if loud else []:
            say(f"[ddrl] skipped: {line}; resuming from {path.name}", err=True)
        if not (run_dir / "log.h5").is_file():
            raise DdrlError(f"--resume: {run_dir / 'log.h5'} is missing")
        return ckpt
    if (run_dir / "log.h5").exists():
        raise DdrlError(f"{run_dir} already holds a run: pass --resume, or choose another --out")
    _check_writable(run_dir)
    return None


def _check_writable(run_dir: Path) -> None:
    """Now, before TensorFlow and the simulators start, rather than at the first log write."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".ddrl-write-check-"):
            pass
    except OSError as exc:
        raise DdrlError(f"run directory {run_dir}: cannot write there "
                        f"({exc.strerror or exc}{': ' + exc.filename if exc.filename else ''})") from None


def hold(run_dir: Path) -> IO:
    """An exclusive lock on the run directory for as long as the returned file stays open (the
    process's life; the kernel drops it when the process dies, however it dies), so that two
    runs on one directory (a job array with a wrong --out, a requeued job whose old step still
    runs) cannot both write it. flock works across hosts on NFS v4; Lustre needs `-o flock`."""
    f = open(run_dir / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "another process"
        f.close()
        raise DdrlError(f"run directory {run_dir} is in use by another run ({owner}): wait for "
                        "it to end, or choose another --out") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f
