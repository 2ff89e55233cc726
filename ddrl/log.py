"""The HDF5 run log (`DIR/log.h5`) written by rank 0, readable while the run goes (SWMR).

SWMR forbids creating datasets or attributes once readers may attach, so every table is
created up front. A crashed SWMR writer leaves the file's consistency flags set; instead
of patching the superblock, `RunLog.resume` rebuilds the file from the readable rows up to
the checkpoint and swaps it in atomically, which also drops rows the resumed run will redo.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ddrl.errors import DdrlError, HardExitError, storage_error
from ddrl.output import say

FORMAT_VERSION = 8

TABLES: dict[str, list[tuple[str, str]]] = {
    "train": [
        ("update", "i8"), ("frames", "i8"), ("wall_time", "f8"), ("loss", "f4"),
        ("policy_loss", "f4"), ("value_loss", "f4"), ("entropy", "f4"), ("grad_norm", "f4"),
        ("approx_kl", "f4"), ("clip_frac", "f4"),
        ("lr", "f4"), ("dp_per_s", "f4"), ("contributors", "i4"), ("effective_batch", "i4"),
        ("policy_lag", "f4"), ("dropped", "i4"), ("staleness", "f4"), ("nonfinite", "i4"),
        ("t_sim", "f4"), ("t_predict", "f4"), ("t_train", "f4"), ("t_sync", "f4"),
        ("restart", "i4"),
        # Weights due for evaluation dropped so far for the cap on those kept (loop/schedule.py).
        ("owed_dropped", "i4"),
    ],
    "episodes": [
        ("rank", "i4"), ("frames", "i8"), ("wall_time", "f8"), ("return", "f4"), ("length", "i4"),
    ],
    "eval": [
        ("update", "i8"), ("frames", "i8"), ("wall_time", "f8"), ("mean_return", "f4"),
        ("std_return", "f4"), ("max_return", "f4"), ("episodes", "i4"),
        # What the evaluation took: wall seconds, and the evaluator's CPU seconds (0 for the
        # final evaluation, played by rank 0 itself).
        ("seconds", "f4"), ("cpu_seconds", "f4"),
        # 1: stopped once eval.target was out of reach (eval.max_return); its mean is over the
        # games that ended first and is no score.
        ("cut", "i1"),
        # The run's wall time when the result was known (its weights were taken at wall_time).
        ("known_at", "f8"),
    ],
    "ranks": [
        ("update", "i8"), ("wall_time", "f8"), ("rank", "i4"), ("frames", "i8"),
        ("dp_per_s", "f4"), ("t_compute", "f4"), ("t_sync", "f4"), ("t_sim", "f4"),
        ("t_predict", "f4"), ("contributed", "i4"),
        # Central mode's actor ranks: seconds idle waiting for actions, seconds from sending a
        # step to its actions (mean), bytes to and from the learner.
        ("t_wait", "f4"), ("t_round", "f4"), ("bytes_in", "i8"), ("bytes_out", "i8"),
        # The rank's peak resident memory so far, MiB (the loop's ranks; 0 for actor ranks).
        ("peak_rss_mb", "f4"),
    ],
    # sync.mode = "ps": each parameter server's cumulative figures as rank 0 last heard them.
    "servers": [
        ("update", "i8"), ("wall_time", "f8"), ("server", "i4"), ("version", "i8"),
        ("received", "i8"), ("applied", "i8"), ("dropped", "i8"), ("sent", "i8"),
        ("staleness_sum", "i8"), ("lost", "i4"), ("bytes_in", "i8"), ("bytes_out", "i8"),
        ("t_busy", "f8"), ("t_apply", "f8"),
    ],
    # sync.mode = "central": the learner's inference batches since the previous row.
    "inference": [
        ("update", "i8"), ("wall_time", "f8"), ("batches", "i8"), ("observations", "i8"),
        ("t_gather", "f8"),
    ],
    # One row per start of the run: the first (restart 0) and each resume, with the world it
    # ran on (a restart after a lost host may have fewer ranks).
    # damaged_log: 1 where this start found the log damaged, set it aside (log.damaged-R.h5,
    # R this start's restart) and went on in a new one holding the rows that could be read.
    "starts": [
        ("restart", "i4"), ("update", "i8"), ("frames", "i8"), ("wall_time", "f8"),
        ("world_size", "i4"), ("nodes", "i4"), ("damaged_log", "i4"),
    ],
}
# The column that says which rows a resume from update U / frame F keeps.
_RESUME_KEY = {"train": "update", "episodes": "frames", "eval": "update", "ranks": "update",
               "servers": "update", "inference": "update", "starts": "update"}


def table_dtype(name: str) -> np.dtype:
    return np.dtype(TABLES[name])


def _by_name(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rows in this version's columns, matched by name: a log of an older format resumes
    with its new columns zero (numpy would match compound fields by position)."""
    out = np.zeros(len(rows), dtype)
    for name in set(rows.dtype.names) & set(dtype.names):
        out[name] = rows[name]
    return out


def _create_tables(f: h5py.File) -> None:
    # Fletcher-32 checksums every chunk: a torn write, a bad disk or a copy gone wrong is
    # then an error on reading, not wrong returns read as data.
    for name in TABLES:
        f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=table_dtype(name),
                         chunks=(1024,), fletcher32=True)


def _failure(exc: Exception) -> str:
    """HDF5's reason (errno's message) out of its multi-line error stack."""
    found = re.search(r"error message = '([^']*)'", str(exc))
    return found[1] if found else str(exc).splitlines()[0]


def _errno(exc: Exception) -> int | None:
    """The errno of a failed write: os.fsync's own, or the one in HDF5's error stack."""
    if getattr(exc, "errno", None):
        return exc.errno
    found = re.search(r"errno = (\d+)", str(exc))
    return int(found[1]) if found else None


def _fsync(f: h5py.File) -> None:
    os.fsync(f.id.get_vfd_handle())


def _unused(path: Path) -> Path:
    """`path`, or with -2, -3 ... before its suffix where that name is taken."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _fsync_dir(directory: Path) -> None:
    """A rename is durable once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Seconds the mirrors get to close at the end of a run.
MIRROR_CLOSE_S = 60.0


class RunLog:
    """Append-only writer for the tables; rows buffer in memory and flush on a timer."""

    def __init__(self, path: Path, f: h5py.File, flush_seconds: float = 2.0):
        self.path = path
        self._f = f
        # Held open for the run: a dataset's close writes its cached chunks, and one that
        # fails there (a full disk) leaves HDF5 to crash in the next flush.
        self._tables = {name: f[name] for name in TABLES}
        # Set by a resume that found the log damaged: what was wrong, and where the old file went.
        self.damaged: str | None = None
        self.set_aside: Path | None = None
        self._pending: dict[str, list[tuple]] = {name: [] for name in TABLES}
        self._flush_seconds = flush_seconds
        self._last_flush = time.monotonic()
        # Live copies of the rows (TensorBoard, W&B): each has write(table, rows, columns),
        # flush() and close().
        self.mirrors: list = []

    @property
    def attrs(self) -> h5py.AttributeManager:
        return self._f.attrs

    @classmethod
    def _publish(cls, tmp: Path, path: Path, f: h5py.File, flush_seconds: float) -> "RunLog":
        """Switch the finished file to SWMR, then give it its name. Until SWMR mode the
        writer holds HDF5's exclusive lock, and a reader that opens the log in that window
        (`ddrl analyze` on a starting run) is refused; under its temporary name no one sees it."""
        f.swmr_mode = True
        _fsync(f)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return cls(path, f, flush_seconds)

    @classmethod
    def create(cls, path: Path, attrs: dict[str, Any], flush_seconds: float = 2.0) -> "RunLog":
        tmp = path.with_suffix(".h5.tmp")
        f = h5py.File(tmp, "w", libver="latest")
        _create_tables(f)
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["restarts"] = 0
        for k, v in attrs.items():
            f.attrs[k] = v
        return cls._publish(tmp, path, f, flush_seconds)

    @classmethod
    def resume(cls, path: Path, update: int, frames: int, restarts: int,
               attrs: dict[str, Any], flush_seconds: float = 2.0) -> "RunLog":
        """Rebuild the log keeping rows up to the checkpoint (update, frames), then reopen it.
        A damaged log (cut short, a table whose checksum fails) is set aside as
        log.damaged-RESTART.h5 and the run goes on in a new log with the rows that could be
        read; `damaged` then says what was wrong, `set_aside` where the old file went."""
        tmp = path.with_suffix(".h5.tmp")
        new = h5py.File(tmp, "w", libver="latest")
        damaged = None
        try:
            _create_tables(new)
            try:
                old = open_log(path)
            except DdrlError as exc:
                old, damaged = None, str(exc)
            with old if old is not None else contextlib.nullcontext():
                for k, v in old.attrs.items() if old is not None else ():
                    new.attrs[k] = v
                for name in TABLES:
                    if old is None or name not in old:
                        continue
                    try:
                        rows = read_table(old, name)
                    except DdrlError as exc:
                        damaged = str(exc)
                        continue
                    limit = frames if _RESUME_KEY[name] == "frames" else update
                    rows = rows[rows[_RESUME_KEY[name]] <= limit]
                    new[name].resize((len(rows),))
                    new[name][:] = _by_name(rows, table_dtype(name))
            # The rebuilt tables are of this version (checksums, new columns).
            new.attrs["format_version"] = FORMAT_VERSION
            new.attrs["restarts"] = restarts
            for k, v in attrs.items():
                new.attrs[k] = v
        except BaseException:
            # The old log stays as it was; a half-built copy must not be left open or behind.
            new.close()
            tmp.unlink(missing_ok=True)
            raise
        aside = None
        if damaged is not None:
            aside = _unused(path.with_name(f"{path.stem}.damaged-{restarts}{path.suffix}"))
            os.replace(path, aside)
        log = cls._publish(tmp, path, new, flush_seconds)
        log.damaged, log.set_aside = damaged, aside
        return log

    def append(self, table: str, row: dict[str, Any]) -> None:
        dtype = table_dtype(table)
        self._pending[table].append(tuple(row.get(n, 0) for n in dtype.names))
        if time.monotonic() - self._last_flush >= self._flush_seconds:
            self.flush()

    def flush(self, sync: bool = False) -> None:
        """`sync`: also to the disk (fsync), not only to the kernel."""
        try:
            for name, rows in self._pending.items():
                if not rows:
                    continue
                ds = self._tables[name]
                n = ds.shape[0]
                ds.resize((n + len(rows),))
                written = np.array(rows, dtype=table_dtype(name))
                ds[n:] = written
                rows.clear()
                self._to_mirrors("write", name, written, list(written.dtype.names))
            self._f.flush()
            self._to_mirrors("flush")
            if sync:
                _fsync(self._f)
        except (OSError, RuntimeError) as exc:
            # A full disk or quota, a vanished file system: what was flushed before stays
            # readable (SWMR writes whole chunks), and the run ends on this one line.
            # One that may pass (an NFS fail-over) is resumable.
            error = storage_error(f"{self.path}: writing the log failed ({_failure(exc)})",
                                  _errno(exc))
            raise HardExitError(str(error), error.exit_code) from None
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._f.id.valid:
            self.flush(sync=True)
            self._f.close()
            # W&B's finish can hang on a cluster's network for ever (a known upstream
            # problem): the log is closed; the mirrors get a deadline.
            closing = threading.Thread(target=self._to_mirrors, args=("close",),
                                       name="ddrl-mirrors-close", daemon=True)
            closing.start()
            closing.join(MIRROR_CLOSE_S)
            if closing.is_alive():
                say(f"ddrl: warning: the log's mirrors did not close within {MIRROR_CLOSE_S:g} s; "
                    f"left behind ({self.path} is complete)", err=True)

    def _to_mirrors(self, op: str, *args) -> None:
        """An optional mirror (TensorBoard, W&B) that fails is dropped with one warning: it
        never ends training, and log.h5 keeps every row."""
        for mirror in list(self.mirrors):
            try:
                getattr(mirror, op)(*args)
            except Exception as exc:  # each mirror's library raises its own kinds
                self.mirrors.remove(mirror)
                say(f"ddrl: warning: the {type(mirror).__name__} mirror failed ({exc}); "
                    f"dropped, the run goes on ({self.path} keeps every row)", err=True)


# HDF5's words for a file whose superblock still flags a writer.
_OPEN_FOR_WRITE = "already open for write"


def _plain_open_failure(path: str | Path) -> str | None:
    """Why a plain (not SWMR) open of the file fails, or None when it opens."""
    try:
        with h5py.File(path, "r"):
            return None
    except OSError as exc:
        return str(exc)


def left_open(path: str | Path) -> bool:
    """Whether the log is still flagged as open by a writer: a live run's, or one whose
    process was killed (SIGKILL, the OOM killer, a lost node) before it closed the log.
    Closing the log clears the flag, and every end the run takes itself closes it."""
    text = _plain_open_failure(path)
    return text is not None and _OPEN_FOR_WRITE in text


def open_log(path: str | Path) -> h5py.File:
    """Open a run log for reading, also while it is written or after its writer was killed.
    A SWMR open of a file cut short does not fail: it hangs in HDF5's metadata retries or
    reads the missing chunks as zeros. A plain open checks the file's length against the
    end its superblock records, so it goes first; it is refused only for a file still
    flagged as open by a writer (a live run or a killed one), which SWMR then reads."""
    text = _plain_open_failure(path)
    if text is not None:
        if "truncated file" in text:
            found = re.search(r"eof = (\d+).*stored_eof = (\d+)", text)
            size = f": {int(found[1]):,} of {int(found[2]):,} bytes" if found else ""
            raise DdrlError(f"{path}: the log is damaged, cut short{size}")
        if _OPEN_FOR_WRITE not in text:
            raise DdrlError(f"{path}: not a readable HDF5 log ({text.splitlines()[0]})")
    return h5py.File(path, "r", swmr=True)


def read_table(f: h5py.File, name: str) -> np.ndarray:
    try:
        ds = f[name]
        ds.refresh()
        return ds[:]
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise DdrlError(f"{f.filename}: table /{name} of the log is damaged "
                        f"({_failure(exc)})") from None
