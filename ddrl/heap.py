"""A rank's C heap over a long run: glibc's arenas capped, free pages given back as it trains.

glibc keeps what a process frees for reuse: a heap shrinks from its top only, so the holes
between arrays still in use stay resident, and each thread may get an arena (a heap) of its
own, up to 8 a core, each holding its share of such memory. Rank 0, whose checkpoints,
evaluations and log add threads and copies of the weights to every rank's work, filled more
arenas as it ran: 40 MiB an hour with glibc's defaults, a quarter of that with 2 arenas
trimmed once a minute, which also left each rank 40-45 MiB smaller
(docs/reliability.md#memory-over-a-long-run).
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Callable

# Arenas a process may have: the main heap and one more. A rank's threads are few and spend
# their time in TensorFlow's kernels and the emulators, not in malloc.
ARENAS = 2
# Seconds between trims: what the heaps may gather in between is a minute's holes.
TRIM_SECONDS = 60.0
_M_ARENA_MAX = -8  # glibc's malloc.h


def _libc_function(name: str) -> Callable[..., int] | None:
    """A glibc function of the running process, or None where the C library has none
    (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None


def cap_arenas() -> None:
    """At most ARENAS arenas from now on; a user's MALLOC_ARENA_MAX wins. Called at import,
    before TensorFlow starts its threads: glibc fixes the limit at the first arena past 8."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, ARENAS)


class HeapTrim:
    """`maybe()` between updates: every whole free page of every arena back to the system
    once a period, holes included (`malloc_trim(0)`, well under a millisecond)."""

    def __init__(self, every_seconds: float = TRIM_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self._trim = _libc_function("malloc_trim")
        self._every, self._clock = every_seconds, clock
        self._last = clock()

    def maybe(self) -> None:
        if self._trim is None or self._clock() - self._last < self._every:
            return
        self._trim(0)
        self._last = self._clock()
