"""Console lines that reach the job's output whole.

`print` writes the text and its newline in two calls when Python is unbuffered (as under
`mpirun` with PYTHONUNBUFFERED=1), so another rank's line can land between them. A single
write(2) of the whole line keeps every line intact: mpirun forwards each rank's pipe reads
as they come, and one write below PIPE_BUF is read in one piece.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any


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


def quiet_first_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with the native log lines of its first call (an XLA compile) dropped."""
    called = False

    def call(*args: Any) -> Any:
        nonlocal called
        if called:
            return fn(*args)
        with quiet_native_logs():
            out = fn(*args)
        called = True
        return out

    return call
