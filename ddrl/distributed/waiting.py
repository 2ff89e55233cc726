"""Waiting for other ranks without spinning a core, and ending the job when they never come.

Open MPI's blocking calls busy-poll; the simulators of the other ranks on a node need that
core more than a rank that only waits. Nonblocking requests tested with growing sleeps keep
the wait cheap and give every wait a deadline.
"""
from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from typing import Callable

import numpy as np

from ddrl.output import say

EXIT_ABORTED = 4
ROLL_CALL_TAG = 77


class Backoff:
    """Polling with growing sleeps: Open MPI's blocking waits spin a core, which the
    simulators of the other ranks on the node need more than a waiting rank does. The first
    `spin` seconds only yield the core: most waits end within them, and a nonblocking
    collective progresses only while it is tested."""

    def __init__(self, first: float = 2e-5, longest: float = 5e-4, spin: float = 0.0):
        self._first, self._longest, self._spin = first, longest, spin
        self.reset()

    def reset(self) -> None:
        self._delay = self._first
        self._spin_until = time.monotonic() + self._spin

    def sleep(self) -> None:
        if self._spin and time.monotonic() < self._spin_until:
            os.sched_yield()
            return
        time.sleep(self._delay)
        self._delay = min(self._delay * 2, self._longest)


def wait_all(requests: list, timeout: float, spin: float = 0.0) -> bool:
    """Whether all requests completed within `timeout` seconds. Each is tested on its own
    (a completed one stays complete), so any object with MPI's `Test` serves."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(spin=spin)
    while not all(r.Test() for r in requests):
        if time.monotonic() > deadline:
            return False
        backoff.sleep()
    return True


def abort(comm, message: str) -> None:
    """End the whole job: a rank that cannot go on would leave the others waiting forever,
    and under mpirun or srun only MPI_Abort also takes down a rank that hangs."""
    say(f"ddrl: error: {message}", err=True)
    comm.Abort(EXIT_ABORTED)


class RollCall:
    """Which ranks never joined a collective that timed out: each rank whose wait timed out
    announces itself to all on a communicator of its own and listens for `grace` seconds
    (the ranks entered the collective at about the same time, so their deadlines pass at about
    the same time too); the ranks not heard from are the silent ones.

    It runs on the watchdog thread while the main thread is inside the collective, which
    needs MPI_THREAD_MULTIPLE (mpi4py asks for it); without it there is no roll call.
    """

    def __init__(self, comm, grace: float):
        from mpi4py import MPI

        self._comm = comm.Dup() if MPI.Query_thread() >= MPI.THREAD_MULTIPLE else None
        self._grace = grace
        self.rank = comm.Get_rank()

    def silent(self) -> tuple[list[int], list[int]] | None:
        """(silent ranks, waiting ranks), or None without a roll call."""
        from mpi4py import MPI

        if self._comm is None:
            return None
        comm, me, size = self._comm, self._comm.Get_rank(), self._comm.Get_size()
        token = np.array([me], np.int32)
        # Small messages go out eagerly: sends to a frozen rank complete all the same.
        requests = [comm.Isend(token, dest=r, tag=ROLL_CALL_TAG) for r in range(size) if r != me]
        heard, got, status = {me}, np.empty(1, np.int32), MPI.Status()
        deadline = time.monotonic() + self._grace
        while len(heard) < size and time.monotonic() < deadline:
            if comm.Iprobe(source=MPI.ANY_SOURCE, tag=ROLL_CALL_TAG, status=status):
                comm.Recv(got, source=status.Get_source(), tag=ROLL_CALL_TAG)
                heard.add(int(got[0]))
            else:
                time.sleep(0.05)
        del requests
        return sorted(set(range(size)) - heard), sorted(heard)


class Watchdog:
    """A deadline for blocking calls that cannot take one (MPI's and Horovod's all-reduce):
    if a guarded call outlasts `timeout`, a watcher thread asks the roll call which ranks never
    came, prints `message(silent)` once for the job (from the lowest waiting rank) and ends
    the process, and the launcher (mpirun, srun -K1) then ends the job. The guarded call stays
    the fast blocking one; arming costs a lock and a notify."""

    def __init__(self, timeout: float, message: Callable[[list[int] | None], str],
                 roll_call: RollCall):
        self._timeout = timeout
        self._message = message
        self._roll_call = roll_call
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
                    break
                self._cv.wait(left)
        found = self._roll_call.silent()
        if found is None:
            say(f"ddrl: error: {self._message(None)}", err=True)
        elif found[1][0] == self._roll_call.rank:
            say(f"ddrl: error: {self._message(found[0])}", err=True)
        else:
            # The lowest waiting rank speaks for all; it exits first and the launcher ends us.
            time.sleep(5.0)
        # Not MPI_Abort: the main thread is inside MPI; exiting is what any launcher notices.
        os._exit(EXIT_ABORTED)


# The deadline's keeper: a shell that outlives nothing (it leaves once it is no longer the
# rank's child) and, past the deadline, says the line and ends the rank.
_KEEPER = """pid=$1 left=$2
while [ "$left" -gt 0 ]; do
  sleep 1; left=$((left - 1))
  set -- $(cat /proc/$$/stat)
  [ "$4" = "$pid" ] || exit 0
done
printf '%s\\n' "$DDRL_DEADLINE_MESSAGE" >&2
kill -KILL "$pid"
"""


class Deadline:
    """A deadline for a start-up step no watchdog can guard: MPI's initialisation and the
    world's discovery, whose collectives come before any communicator a roll call could use.
    MPI_Init holds Python's lock while it waits, so no thread of this process could keep the
    time: a shell child does. Past `seconds` it prints `message` in one line and kills the
    process, and the launcher ends the job. Launcher rank 0 speaks at once; the others 5 s
    later, by which time the launcher has usually ended them, so a job says it once."""

    def __init__(self, seconds: float, message: str, speaker: bool):
        self._seconds = math.ceil(seconds) + (0 if speaker else 5)
        self._message = f"ddrl: error: {message}"
        self._keeper: subprocess.Popen | None = None

    def __enter__(self) -> "Deadline":
        self._keeper = subprocess.Popen(
            ["/bin/sh", "-c", _KEEPER, "ddrl-deadline", str(os.getpid()), str(self._seconds)],
            env={**os.environ, "DDRL_DEADLINE_MESSAGE": self._message}, stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        self._keeper.kill()
        self._keeper.wait()


def _ranks(ranks: list[int] | None) -> str:
    if ranks is None:
        return "the other rank(s)"
    if not ranks:
        return "the others, all waiting too (the network between them?)"
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}, which never joined"


def collective_watchdog(world, timeout: float, what: Callable[[], str],
                        limit: str = "sync.timeout") -> Watchdog:
    """A watchdog for the blocking collectives of `world`; its line names the call (`what()`),
    the limit and the ranks that never joined."""
    return Watchdog(timeout, lambda silent: (
        f"rank {world.rank} waited {timeout:g} s ({limit}) in {what()} for {_ranks(silent)}: "
        "frozen or lost; ending the job"),
        RollCall(world.comm, grace=min(30.0, max(5.0, timeout / 10))))
