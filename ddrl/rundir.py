"""Run directories: where a run's log and checkpoints go, and whether a new run or a resume
may use one."""
from __future__ import annotations

import datetime
import fcntl
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import IO

from ddrl import checkpoint
from ddrl.config import Config, identity_changes
from ddrl.errors import DdrlError
from ddrl.log import open_log
from ddrl.output import say

LOCK_TRIES = 10


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


def prepare(run_dir: Path, resume: bool, loud: bool, cfg: Config) -> checkpoint.Checkpoint | None:
    """The checkpoint to resume from; refuses to write over an existing run's log, and a
    resume whose job changes what the checkpoints are of."""
    if resume:
        saved = run_dir / "config.toml"
        changes = identity_changes(cfg, saved.read_text()) if saved.is_file() else []
        if changes:
            raise DdrlError(f"--resume: this job does not fit the run in {run_dir} "
                            f"({'; '.join(changes)}): resume it with its own job file")
        path, ckpt, damaged = checkpoint.latest_intact(run_dir / "checkpoints")
        if ckpt is None:
            detail = f" ({len(damaged)} damaged: {damaged[0]})" if damaged else ""
            raise DdrlError(f"--resume: no intact checkpoint in {run_dir / 'checkpoints'}{detail}")
        for line in damaged if loud else []:
            say(f"[ddrl] skipped: {line}; resuming from {path.name}", err=True)
        if not (run_dir / "log.h5").is_file():
            raise DdrlError(f"--resume: {run_dir / 'log.h5'} is missing")
        # Two resumes from one checkpoint (the first failed before its next one) are two
        # restarts: new random streams, a true count.
        ckpt.restarts = max(ckpt.restarts, _logged_restarts(run_dir / "log.h5"))
        return ckpt
    if (run_dir / "log.h5").exists():
        raise DdrlError(f"{run_dir} already holds a run: pass --resume, or choose another --out")
    if checkpoint.latest(run_dir / "checkpoints") is not None:
        # Rotation would keep the old run's higher-numbered files over the new run's.
        raise DdrlError(f"{run_dir / 'checkpoints'} holds an earlier run's checkpoints (its "
                        "log.h5 is gone): move them away, or choose another --out")
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


def _logged_restarts(path: Path) -> int:
    """The restart the log last started (0 for a log too damaged to say: the resume sets it
    aside)."""
    try:
        with open_log(path) as f:
            return int(f.attrs.get("restarts", 0))
    except (DdrlError, OSError):
        return 0


def hold(run_dir: Path) -> IO:
    """An exclusive lock on the run directory for as long as the returned file stays open (the
    process's life; the kernel drops it when the process dies, however it dies), so that two
    runs on one directory (a job array with a wrong --out, a requeued job whose old step still
    runs) cannot both write it. Taken before the directory is looked at, so that two runs
    started together cannot both find it free. flock works across hosts on NFS v4; Lustre
    needs `-o flock`."""
    _check_writable(run_dir)
    f = open(run_dir / ".lock", "a+")
    # A few tries: `ddrl status` takes a shared lock for an instant to see if a run holds it.
    for _ in range(LOCK_TRIES):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.1)
    else:
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
