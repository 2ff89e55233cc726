"""Console lines that reach the job's output whole.

`print` writes the text and its newline in two calls when Python is unbuffered (as under
`mpirun` with PYTHONUNBUFFERED=1), so another rank's line can land between them. A single
write(2) of the whole line keeps every line intact: mpirun forwards each rank's pipe reads
as they come, and one write below PIPE_BUF is read in one piece.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Iterator


def say(text: str, err: bool = False) -> None:
    """One line to stdout (or stderr) in one write; flushes what Python buffered before it."""
    stream = sys.stderr if err else sys.stdout
    data = (text + "\n").encode()
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        # A replaced stream (pytest's capture, an io.StringIO): one write call is the best there.
        stream.write(text + "\n")
        stream.flush()
        return
    stream.flush()
    while data:
        data = data[os.write(fd, data):]


class PhaseProgress:
    """A line every `seconds` through a long phase that is not training (DQN's
    prepopulation): how far, how fast, how long still; silent where `seconds` is 0."""

    def __init__(self, what: str, total: int, unit: str, seconds: float):
        self._what, self._total, self._unit, self._seconds = what, total, unit, seconds
        self._start = self._last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self._seconds or now - self._last < self._seconds or not done:
            return
        self._last = now
        rate = done / (now - self._start)
        left = max(self._total - done, 0) / rate
        say(f"[ddrl] {self._what}: {done:,} of {self._total:,} {self._unit} "
            f"({100 * done / self._total:.0f}%), {rate:,.0f}/s, "
            f"{int(left // 60):02d}:{int(left % 60):02d} left")


@contextlib.contextmanager
def quiet_native_logs() -> Iterator[None]:
    """XLA's first compile logs two lines through C++ absl, which no environment variable
    silences; they go to /dev/null unless the user asked for TensorFlow's logs by setting
    TF_CPP_MIN_LOG_LEVEL below 3. Only native writes are dropped: Python's own errors in
    the block arrive as exceptions, not as writes."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    if not level.isdigit() or int(level) < 3:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@functools.cache
def spend_xla_first_logs() -> None:
    """XLA logs its lines once per process, at the first compile: a trivial compile here
    spends them quietly, so the compiles that come later (the network's input stem, Adam's
    update, on whichever thread is first) print nothing."""
    import tensorflow as tf

    with quiet_native_logs():
        tf.function(lambda x: x + 1, jit_compile=True, autograph=False)(tf.zeros(1))
