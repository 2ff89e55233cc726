"""Console lines that reach the job's output whole.

`print` writes the text and its newline in two calls when Python is unbuffered (as under
`mpirun` with PYTHONUNBUFFERED=1), so another rank's line can land between them. A single
write(2) of the whole line keeps every line intact: mpirun forwards each rank's pipe reads
as they come, and one write below PIPE_BUF is read in one piece.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
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


# A line of TensorFlow's C++ logging (Abseil's format: severity I, W or E, date, time, in epoch
# seconds before Abseil is set up, thread, file:line]) or Abseil's notice that it logs before
# being set up; a fatal (F) line is kept.
_NATIVE_LOG_LINE = re.compile(
    rb"^(?:[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] |"
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called)")


@contextlib.contextmanager
def quiet_native_logs() -> Iterator[None]:
    """TensorFlow's native code logs lines that TF_CPP_MIN_LOG_LEVEL does not reach: XLA's
    first compile (two lines), and, with 2.18, the loading of the library itself (Abseil's
    notice, CUDA plugins registered twice). What the block writes to the stderr descriptor
    goes to a file, and all but those log lines is written back after it, so an error line
    or a fatal message is never lost; all of it passes when the user asked for TensorFlow's
    logs by setting TF_CPP_MIN_LOG_LEVEL below 3."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    if not level.isdigit() or int(level) < 3:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught if not _NATIVE_LOG_LINE.match(line))
            while kept:
                kept = kept[os.write(2, kept):]


# tf-keras, which TensorFlow imports whole as it loads, imports pandas to take DataFrames as
# training data, which ddrl never gives it (optional there: None when the import fails): about
# 0.6 s of the import's 4.6 s of CPU on an AMD EPYC Zen 3 core, paid by every rank, evaluator
# and restart.
_UNUSED_BY_KERAS = ("pandas",)


class _Unused(importlib.abc.MetaPathFinder):
    """Refuses `_UNUSED_BY_KERAS` while TensorFlow loads; they import as usual afterwards."""

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name in _UNUSED_BY_KERAS:
            raise ModuleNotFoundError(f"{name} is not imported while TensorFlow loads", name=name)
        return None


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Imports TensorFlow inside `quiet_native_logs`, from whichever module imports it first,
    since the lines it logs while loading come before any of ddrl's code could run; and
    without Keras' optional imports ddrl does not use (`_UNUSED_BY_KERAS`)."""

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def quiet_exec_module(module: object) -> None:
            unused = _Unused()
            sys.meta_path.insert(0, unused)
            try:
                with quiet_native_logs():
                    exec_module(module)
            finally:
                sys.meta_path.remove(unused)

        spec.loader.exec_module = quiet_exec_module
        return spec


def quiet_tensorflow_import() -> None:
    """Makes the first `import tensorflow` of the process quiet (`quiet_native_logs`)."""
    if "tensorflow" not in sys.modules and \
            not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


@functools.cache
def spend_xla_first_logs() -> None:
    """XLA logs its lines once per process, at the first compile: a trivial compile here
    spends them quietly, so the compiles that come later (the network's input stem, on
    whichever thread is first) print nothing."""
    import tensorflow as tf

    with quiet_native_logs():
        tf.function(lambda x: x + 1, jit_compile=True, autograph=False)(tf.zeros(1))
