"""Run directories: where a run's log and checkpoints go, and whether a new run or a resume
may use one."""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from ddrl.config import Config, identity_changes
from ddrl.errors import DdrlError, InUseError
from ddrl.output import say
from ddrl.rundir import checkpoint
from ddrl.rundir.log import open_log

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


def remove_leftovers(run_dir: Path) -> int:
    """The temporary files of writes a kill cut short (a checkpoint's, a replay memory's
    gigabytes, a log being rebuilt), removed by the run that holds the directory, which no
    other writer shares; how many."""
    removed, size = 0, 0
    for path in [*(run_dir / "checkpoints").glob(".*.tmp"), *run_dir.glob("*.h5.tmp")]:
        with contextlib.suppress(OSError):
            bytes_ = path.lstat().st_size
            path.unlink()  # a symlink planted there goes, not what it points to
            removed, size = removed + 1, size + bytes_
    if removed:
        say(f"[ddrl] note: removed {removed} temporary file(s) of writes cut short "
            f"({size / 2**20:.1f} MiB) from {run_dir}", err=True)
    return removed


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


class Lock:
    """A run directory held by this process: an flock on `.lock` where the filesystem has
    one, and always a lock file `.lock.owner` made with O_EXCL, naming host and pid, whose
    mtime a thread renews every HEARTBEAT_S. flock alone fails where it is unsupported (Lustre
    without `-o flock`, NFS without lockd: ENOSYS) and locks nothing where it is node-local;
    the lock file works on any filesystem that honours O_EXCL (NFS v3 and later, Lustre)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / OWNER
        self._flock: IO | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def take(self) -> "Lock":
        run_dir = self.path.parent
        try:
            self._flock = _flock(run_dir)
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise DdrlError(f"run directory {run_dir}: cannot lock it "
                                f"({exc.strerror or exc})") from None
            say(f"[ddrl] note: {run_dir} is on a filesystem without flock ({exc.strerror}): "
                "its lock is the lock file alone", err=True)
        try:
            _exclusive_owner(self.path)
        except InUseError:
            self.close()
            raise
        self._beat = threading.Thread(target=self._heartbeat, name="ddrl-lock", daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:  # a filesystem that passes; the next beat tries again
                pass

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            with contextlib.suppress(OSError):
                if _owner_text(self.path) == _me():
                    self.path.unlink()
        if self._flock is not None:
            self._flock.close()
            self._flock = None


# flock unsupported: ENOSYS (Lustre without -o flock), ENOLCK (NFS without lockd), EOPNOTSUPP.
_NO_FLOCK = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}
OWNER = ".lock.owner"
HEARTBEAT_S = 5.0
# A lock file unrenewed this long belongs to a run that is gone (killed with its node).
STALE_S = 30.0


def _me() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def _owner_text(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        return f.read().strip()


def _flock(run_dir: Path) -> IO:
    # O_NOFOLLOW: a symlink planted as .lock must not make the run write through it.
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    f = os.fdopen(fd, "a+")
    # A few tries: `ddrl status` takes a shared lock for an instant to see if a run holds it.
    for _ in range(LOCK_TRIES):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:
            f.close()
            raise
    else:
        f.seek(0)
        owner = f.read().strip() or "another process"
        f.close()
        raise InUseError(f"run directory {run_dir} is in use by another run ({owner}): wait "
                         "for it to end, or choose another --out")
    f.seek(0)
    f.truncate()
    f.write(_me() + "\n")
    f.flush()
    return f


def _exclusive_owner(path: Path) -> None:
    """Creates the lock file, or takes it over from a run that is gone: on this host a pid
    that no longer exists, anywhere a heartbeat older than STALE_S."""
    for _ in range(LOCK_TRIES):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            if _gone(path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            try:
                owner = _owner_text(path) or "another process"
            except OSError:
                owner = "another process"
            raise InUseError(f"run directory {path.parent} is in use by another run ({owner}, "
                             f"its lock file renewed within {STALE_S:g} s): wait for it to "
                             "end, or choose another --out") from None
        with os.fdopen(fd, "w") as f:
            f.write(_me() + "\n")
        return
    raise InUseError(f"run directory {path.parent}: its lock file keeps coming back")


def _gone(path: Path) -> bool:
    try:
        age = time.time() - path.stat().st_mtime
        words = _owner_text(path).split()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if age > STALE_S:
        return True
    if len(words) == 4 and words[0] == "pid" and words[3] == socket.gethostname():
        try:
            os.kill(int(words[1]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError):
            return False
    return False


def held_by_a_run(run_dir: Path) -> bool | None:
    """Whether a live run holds the directory: True, False, or None where it cannot be told
    (a lock file unreadable here)."""
    path = run_dir / OWNER
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except OSError:  # ESTALE from an NFS client, EIO: the file is there, its state unknown
        return None
    return not _gone(path)


def hold(run_dir: Path) -> Lock:
    """An exclusive hold on the run directory for as long as this process keeps it (its
    life), so that two runs on one directory (a job array with a wrong --out, a requeued job
    whose old step still runs) cannot both write it. Taken before the directory is looked at,
    so that two runs started together cannot both find it free. The flock is dropped by the
    kernel however the process dies; the lock file by its owner, or once its heartbeat stops
    (STALE_S) or its pid is gone."""
    _check_writable(run_dir)
    return Lock(run_dir).take()
