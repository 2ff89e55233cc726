"""Waiting for other ranks without spinning a core, and ending the job when they never come.

Open MPI's blocking calls busy-poll; the simulators of the other ranks on a node need that
core more than a rank that only waits. Nonblocking requests tested with growing sleeps keep
the wait cheap and give every wait a deadline.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ddrl.output import say

EXIT_ABORTED = 4


class Backoff:
    """Polling with growing sleeps: Open MPI's blocking waits spin a core, which the
    simulators of the other ranks on the node need more than a waiting rank does."""

    def __init__(self, first: float = 2e-5, longest: float = 5e-4):
        self._first, self._longest = first, longest
        self._delay = first

    def reset(self) -> None:
        self._delay = self._first

    def sleep(self) -> None:
        time.sleep(self._delay)
        self._delay = min(self._delay * 2, self._longest)


def wait_all(requests: list, timeout: float) -> bool:
    """Whether all requests completed within `timeout` seconds."""
    from mpi4py import MPI

    deadline = time.monotonic() + timeout
    backoff = Backoff()
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            return False
        backoff.sleep()
    return True


def abort(comm, message: str) -> None:
    """End the whole job: a rank that cannot go on would leave the others waiting forever,
    and under mpirun or srun only MPI_Abort also takes down a rank that hangs."""
    say(f"ddrl: error: {message}", err=True)
    comm.Abort(EXIT_ABORTED)


class Watchdog:
    """A deadline for blocking calls that cannot take one (MPI's and Horovod's all-reduce):
    if a guarded call outlasts `timeout`, a watcher thread prints `message()` and ends the
    process, and the launcher (mpirun, srun -K1) then ends the job. The guarded call stays the
    fast blocking one; arming costs a lock and a notify."""

    def __init__(self, timeout: float, message: Callable[[], str]):
        self._timeout = timeout
        self._message = message
        self._armed_at: float | None = None
        self._cv = threading.Condition()
        threading.Thread(target=self._watch, daemon=True, name="ddrl-watchdog").start()

    def __enter__(self) -> "Watchdog":
        with self._cv:
            self._armed_at = time.monotonic()
            self._cv.notify()
        return self

    def __exit__(self, *exc) -> None:
        with self._cv:
            self._armed_at = None

    def _watch(self) -> None:
        with self._cv:
            while True:
                if self._armed_at is None:
                    self._cv.wait()
                    continue
                left = self._armed_at + self._timeout - time.monotonic()
                if left <= 0:
                    say(f"ddrl: error: {self._message()}", err=True)
                    # Not MPI_Abort: the main thread is inside MPI; exiting is what any
                    # launcher notices.
                    os._exit(EXIT_ABORTED)
                self._cv.wait(left)
