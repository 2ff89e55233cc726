"""Orderly stops: the signals a batch system sends before it ends a job; and a process that
stops itself, for the fault tests."""
from __future__ import annotations

import os
import signal
import threading
import time


def freeze(seconds: float = 0.0) -> None:
    """Fault injection (`debug.*`): this process hung, for `seconds` (its other threads go
    on, as in a slow import from a shared filesystem) or, with 0, for ever (SIGSTOP: all of
    it, as a host that froze)."""
    if seconds:
        time.sleep(seconds)
    else:
        os.kill(os.getpid(), signal.SIGSTOP)


class StopSignals:
    """SIGUSR1 (Slurm's pre-timeout warning) and SIGTERM (scancel, preemption) ask for an
    orderly stop at the next update boundary instead of killing the process mid-write."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        # Set by the first signal: what the final phase (evaluation, checkpoint) waits on.
        self.event = threading.Event()
        self.job_stopping = False
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        # Only the first signal sets the event. A second one can land inside this handler
        # while Event.set holds its lock (scancel's TERM and the batch script's USR1 come
        # milliseconds apart); Python runs its handler there, in the same thread, and a
        # second Event.set would wait on that lock for ever.
        if self.received is not None:
            return
        self.received = signum
        self.event.set()

    def __exit__(self, *exc) -> None:
        # After a stop request, Slurm often sends a second signal (TERM from scancel plus the
        # batch script's forwarded USR1): ignore it so it cannot kill the orderly exit. So
        # also when another rank's signal stopped the job (`job_stopping`): across nodes this
        # rank's own copy of the signal can arrive after the job has agreed to stop.
        stopping = self.received is not None or self.job_stopping
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if stopping else handler)
