"""The stop signals' handler (`ddrl.signals.StopSignals`)."""
from __future__ import annotations

import signal
import threading

from ddrl.signals import StopSignals


def test_a_second_stop_signal_does_not_wait_on_the_first_ones_lock():
    """scancel's TERM and the batch script's USR1 reach a rank milliseconds apart: the second
    handler can run inside the first, in the same thread, while Event.set holds its lock. It
    waited on that lock for ever and the rank hung instead of checkpointing. Here the lock
    is held as the first handler holds it, and the second handler must return."""
    stops = StopSignals()
    stops._handle(signal.SIGTERM, None)
    with stops.event._cond:  # held, as inside the first handler's Event.set
        second = threading.Thread(target=stops._handle, args=(signal.SIGUSR1, None), daemon=True)
        second.start()
        second.join(5)
        assert not second.is_alive(), "the second signal's handler waits on the first's lock"
    assert stops.event.is_set() and stops.received == signal.SIGTERM
