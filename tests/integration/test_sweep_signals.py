"""`ddrl sweep` hands a stop signal to the run it is running: each of the signals a user or a
scheduler stops a run with becomes the ranks' checkpoint-and-stop (SIGUSR1 to mpirun), with a
real child process in mpirun's place."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from ddrl.commands.sweep import EXIT_SIGNALLED, _run_forwarding_signals

# What stands in for mpirun: exit 3 (checkpointed, as `ddrl train` does) on SIGUSR1 alone,
# 0 after 10 s if none came.
CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(3))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(9))
pathlib.Path(sys.argv[1]).touch()
time.sleep(10)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1],
                         ids=lambda s: s.name)
def test_a_stop_signal_reaches_the_run_as_its_checkpoint_signal(sig, tmp_path):
    """SIGUSR1 is `ddrl train`'s own stop signal (`timeout -s USR1`): a sweep used to die of it
    silently, exit 138 (fails on that code: the run is never told, and runs out its 10 s)."""
    ready = tmp_path / "ready"
    ours = lambda *_: None  # noqa: E731 - the old code must not end pytest with the signal
    original = signal.signal(sig, ours)
    forwarding = []

    def stop() -> None:
        deadline = time.monotonic() + 20
        while not (ready.exists() and signal.getsignal(sig) is not ours):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        forwarding.append(True)
        os.kill(os.getpid(), sig)

    threading.Thread(target=stop, daemon=True).start()
    try:
        code, asked = _run_forwarding_signals([sys.executable, "-c", CHILD, str(ready)])
    finally:
        signal.signal(sig, original)
    assert (code, asked) == (EXIT_SIGNALLED, True), (code, asked, forwarding)
