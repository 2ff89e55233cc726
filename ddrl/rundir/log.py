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

FORMAT_VERSION = 10
# What each format version added; a resumed older log gets the new columns as zeros.
FORMAT_HISTORY = {
    10: "`held` in `/eval`",
    9: "`longest` in `/eval`",
    8: "`cut` and `known_at` in `/eval`, `owed_dropped` in `/train`",
    7: "`seconds` and `cpu_seconds` in `/eval`",
    6: "Fletcher-32 checksums on every chunk, `damaged_log` in `/starts`, `peak_rss_mb` in `/ranks`",
    5: "`/inference` and the central-mode columns of `/ranks`",
    4: "`/starts`",
    3: "`nonfinite` in `/train`",
    2: "`approx_kl` and `clip_frac` in `/train`",
}
ROOT_ATTRIBUTES = {
    "config": "JSON of the resolved config",
    "world_size": "ranks", "nodes": "hosts",
    "versions": "JSON: python, tensorflow, horovod, mpi4py, the MPI library, ale-py, ...",
    "cpu": "the CPU as `ddrl info` names it", "cores": "the cores of all ranks together",
    "start_time": "the first start, ISO 8601 with its time zone", "restarts": "starts after the first",
    "sync_backend": "the gradient sync that ran",
    "precision": "the network's compute precision as run (`model.precision` resolved: float32 or bfloat16)",
    "format_version": "the log format's version",
}
# Each table: what a row is, and its columns as (name, numpy type, what it holds); the
# reference page (docs/reference/log-format.md) is generated from these.
TABLE_ROWS = {
    "train": "One row every `run.log_every` updates",
    "episodes": "One row per whole training game",
    "eval": "One row per evaluation",
    "ranks": "One row per rank every `run.log_every` updates",
    "servers": "`sync.mode = \"ps\"` only: each parameter server's cumulative figures as rank 0 "
               "last heard them",
    "inference": "`sync.mode = \"central\"` only, one row per `/train` row: the learner's "
                 "inference batches since the previous row",
    "starts": "One row per start of the run: the first (restart 0) and each resume, with the "
              "world it ran on (a restart after a lost host may have fewer ranks)",
}
TABLES: dict[str, list[tuple[str, str, str]]] = {
    "train": [
        ("update", "i8", "the update's number"),
        ("frames", "i8", "emulator frames, all ranks"),
        ("wall_time", "f8", "seconds since the run started, continuing across restarts"),
        ("loss", "f4", "for DQN the Huber TD loss"),
        ("policy_loss", "f4", "NaN for DQN"),
        ("value_loss", "f4", "for DQN the Huber TD loss"),
        ("entropy", "f4", "the policy's mean entropy, nats"),
        ("grad_norm", "f4", "rank 0's gradient's global norm, before any clip (with `sync.virtual_fused`: "
                            "the mean of its process's virtual ranks' gradients)"),
        ("approx_kl", "f4", "PPO's KL estimate (r - 1) - log r; for `vtrace` the acting policy against the "
                            "learner's on the batch; NaN for A2C and DQN"),
        ("clip_frac", "f4", "PPO's fraction of clipped ratios; NaN otherwise"),
        ("lr", "f4", "the learning rate applied"),
        ("dp_per_s", "f4", "data points/s, all ranks"),
        ("contributors", "i4", "gradients aggregated, virtual ranks' included"),
        ("effective_batch", "i4", "data points in the update, all ranks"),
        ("policy_lag", "f4", "updates between acting and training; for DQN the age of the replayed steps"),
        ("dropped", "i4", "gradients left out of the update (k-of-n, too stale)"),
        ("staleness", "f4", "mean updates between the weights a gradient was computed on and those it was "
                            "applied to"),
        ("nonfinite", "i4", "updates since the previous row whose summed gradient held NaN or Inf: dropped "
                            "on every rank, never applied"),
        ("t_sim", "f4", "seconds per update in the simulators, summed over the acting threads and "
                        "virtual ranks: above the update's wall time where several act at once"),
        ("t_predict", "f4", "seconds per update inferring to act, summed as t_sim (a ba3c "
                            "predictor thread's include its waits for the others)"),
        ("t_train", "f4", "seconds per update"),
        ("t_sync", "f4", "seconds per update"),
        ("restart", "i4", "the start that wrote the row (0: the first)"),
        ("owed_dropped", "i4", "weights due for evaluation dropped so far for the cap on those kept "
                               "(loop/schedule.py)"),
    ],
    "episodes": [
        ("rank", "i4", "the rank whose simulator played it"),
        ("frames", "i8", "the run's frames when it ended"),
        ("wall_time", "f8", "when it ended"),
        ("return", "f4", "the whole game's, unclipped"),
        ("length", "i4", "agent steps"),
    ],
    "eval": [
        ("update", "i8", "the update whose weights played"),
        ("frames", "i8", "the run's frames at those weights"),
        ("wall_time", "f8", "when the evaluated weights were taken"),
        ("mean_return", "f4", "over the games, unclipped"),
        ("std_return", "f4", "over the games"),
        ("max_return", "f4", "the best game"),
        ("episodes", "i4", "games played"),
        ("seconds", "f4", "wall time the evaluation took"),
        ("cpu_seconds", "f4", "the evaluator process's CPU time for it; 0 for the final evaluation, which "
                              "rank 0 plays itself"),
        ("cut", "i1", "1: stopped once `eval.target` was out of reach (`eval.max_return`); its mean is over "
                      "the games that ended first (none ended: the games going, as if played to the end "
                      "at the same rate) and is no score"),
        ("known_at", "f8", "the run's wall time when the result was known"),
        ("longest", "i4", "agent steps of the longest game (of the longest still going, when cut): what the "
                          "evaluation's wait was made of; 0 in rows written before format 9"),
        ("held", "f4", "seconds the ranks waited for it (one released past `eval.pause_limit`: until "
                       "then), charged to `eval.pause_share` but for a confirmation's; 0 in the background "
                       "and in rows written before format 10"),
    ],
    "ranks": [
        ("update", "i8", "the update of the row"),
        ("wall_time", "f8", "seconds since the run started"),
        ("rank", "i4", "the rank's number"),
        ("frames", "i8", "the rank's frames so far"),
        ("dp_per_s", "f4", "the rank's data points/s"),
        ("t_compute", "f4", "seconds computing per update"),
        ("t_sync", "f4", "seconds in the sync per update"),
        ("t_sim", "f4", "seconds in the simulators per update, summed as /train's"),
        ("t_predict", "f4", "seconds inferring per update, summed as /train's"),
        ("contributed", "i4", "1: the rank's gradient was in the update"),
        ("t_wait", "f4", "central mode's actor ranks: seconds idle, waiting for actions"),
        ("t_round", "f4", "actor ranks: mean seconds from a step sent to its actions"),
        ("bytes_in", "i8", "actor ranks: bytes from the learner since the previous row"),
        ("bytes_out", "i8", "actor ranks: bytes to the learner since the previous row"),
        ("peak_rss_mb", "f4", "the rank's peak resident memory so far, MiB; 0 for actor ranks"),
    ],
    "servers": [
        ("update", "i8", "the update of the row"),
        ("wall_time", "f8", "seconds since the run started"),
        ("server", "i4", "the server's number"),
        ("version", "i8", "its weights' version"),
        ("received", "i8", "gradients received"),
        ("applied", "i8", "gradients applied"),
        ("dropped", "i8", "gradients dropped as too stale"),
        ("sent", "i8", "weights sent"),
        ("staleness_sum", "i8", "the applied gradients' staleness, summed"),
        ("lost", "i4", "workers it counts as lost"),
        ("bytes_in", "i8", "bytes received"),
        ("bytes_out", "i8", "bytes sent"),
        ("t_busy", "f8", "seconds busy"),
        ("t_apply", "f8", "seconds applying gradients"),
    ],
    "inference": [
        ("update", "i8", "the update of the row"),
        ("wall_time", "f8", "seconds since the run started"),
        ("batches", "i8", "the learner's inference batches since the previous row"),
        ("observations", "i8", "in those batches"),
        ("t_gather", "f8", "seconds gathering them"),
    ],
    "starts": [
        ("restart", "i4", "0: the first start, then 1, 2, ..."),
        ("update", "i8", "the update it began at"),
        ("frames", "i8", "the frames it began at"),
        ("wall_time", "f8", "the run's wall time it began at"),
        ("world_size", "i4", "ranks"),
        ("nodes", "i4", "hosts"),
        ("damaged_log", "i4", "1: this start found the log damaged, set it aside as `log.damaged-R.h5` (R "
                              "this start's restart) and went on in a new one holding the rows that could "
                              "be read"),
    ],
}
# The column that says which rows a resume from update U / frame F keeps.
_RESUME_KEY = {"train": "update", "episodes": "frames", "eval": "update", "ranks": "update",
               "servers": "update", "inference": "update", "starts": "update"}


def table_dtype(name: str) -> np.dtype:
    return np.dtype([(column, kind) for column, kind, _ in TABLES[name]])


def reference_markdown() -> str:
    """The log-format reference page, from the tables above (built by the docs' hook)."""
    attrs = ", ".join(f"`{k}` ({v})" for k, v in ROOT_ATTRIBUTES.items())
    history = "; ".join(f"{v}: {what}" for v, what in FORMAT_HISTORY.items())
    lines = ["# The HDF5 log", "",
             "`DIR/log.h5`, written by rank 0 in SWMR mode: readers open it with "
             "`h5py.File(path, \"r\", swmr=True)` while the run goes (rows are flushed at "
             "least every 2 s; a log whose writer was killed is read the same way), or with "
             "`analysis.load`. Frames are emulator frames.", "",
             f"Root attributes: {attrs}.", "",
             f"Format versions (a resumed older log gets the new columns as zeros): {history}.",
             ""]
    for name, columns in TABLES.items():
        lines += [f"## `/{name}`", "", f"{TABLE_ROWS[name]}.", "",
                  "| column | type | holds |", "|---|---|---|"]
        lines += [f"| `{c}` | {np.dtype(kind).name} | {doc} |" for c, kind, doc in columns]
        lines.append("")
    return "\n".join(lines)


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

    def rows(self, table: str) -> np.ndarray:
        """A table's rows written so far, those buffered too."""
        written = read_table(self._f, table)
        pending = self._pending[table]
        if not pending:
            return written
        return np.concatenate([written, np.array(pending, dtype=table_dtype(table))])

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
        """An optional mirror (TensorBoard, W&B) whose service fails is dropped with one
        warning: it never ends training, and log.h5 keeps every row. One whose disk fails
        (a DdrlError: TensorBoard's file beside the log) ends the run on that one line, as the
        log's own write would a moment later: a full disk is one error, whichever write meets
        it first."""
        for mirror in list(self.mirrors):
            try:
                getattr(mirror, op)(*args)
            except Exception as exc:  # each mirror's library raises its own kinds
                # At close (another thread) the log is complete: nothing left to end.
                if isinstance(exc, DdrlError) and op != "close":
                    raise HardExitError(str(exc), exc.exit_code) from None
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
