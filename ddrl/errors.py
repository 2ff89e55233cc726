"""The exceptions that reach users as a one-line message instead of a traceback."""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

# A full disk or quota, a read-only or vanished file system: the machine's fault, not ddrl's.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ESTALE,
                   errno.ENOTCONN, errno.ETIMEDOUT}
# Among them, those a network filesystem returns while its server fails over or its client
# reconnects (NFS, Lustre): they may pass, so a run that meets one can go on later.
PASSING_ERRNOS = {errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ETIMEDOUT}


class DdrlError(Exception):
    """A problem with the user's input or environment, reported as `ddrl: error: <message>`
    and this exit code."""
    exit_code = 2


class EveryRankError(DdrlError):
    """One that every rank of a job reaches alike, from the same job file, overrides and world
    size: only the first rank reports it, so the user reads it once, and every rank exits
    without MPI_Abort's banner."""


class InUseError(DdrlError):
    """A run directory held by another live run: not the user's mistake nor final (the other
    run may be a requeued job's old step about to end), so it has an exit code of its own."""
    exit_code = 6


class StorageFaultError(DdrlError):
    """A storage error that may pass (PASSING_ERRNOS): the run ends with its last good
    checkpoint and an exit code of its own, which the Slurm scripts restart from (a full disk
    or a read-only mount is final: exit 2). `reason`: what failed, without the advice."""
    exit_code = 7

    def __init__(self, reason: str):
        super().__init__(f"{reason}; the fault may pass (exit {self.exit_code}): try again, "
                         "or --resume a run")
        self.reason = reason


class HardExitError(DdrlError):
    """One after which the interpreter's normal exit would crash: HDF5, holding a log it
    could not write (a full disk), segfaults when it tries again at exit. Reported, then
    the process ends at once with `exit_code`; what was flushed before stays readable."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def storage_error(message: str, code: int | None) -> DdrlError:
    """The error for a failed write whose errno is `code`: one that may pass says so and
    is resumable."""
    return StorageFaultError(message) if code in PASSING_ERRNOS else DdrlError(message)


@contextlib.contextmanager
def storage_errors(path: str | os.PathLike | None = None) -> Iterator[None]:
    """A failed write to storage as a one-line error naming the file (`path` where the
    OSError does not: a write to an open file); other OSErrors pass."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _STORAGE_ERRNOS:
            raise
        raise storage_error(f"{exc.filename or path or 'writing a file'}: {exc.strerror}",
                            exc.errno) from None
