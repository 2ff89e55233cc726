"""The log's figures as TensorBoard scalars: written live beside `log.h5` by rank 0
(`run.tensorboard`) and afterwards by `ddrl export --tensorboard`, from the same rows.

Scalars are stepped by frames (the x axis of every curve here) and stamped with the run's own
wall clock (its start time + the row's `wall_time`), so TensorBoard's "relative" axis shows
training time. Tags are `TABLE/COLUMN`; a NaN (a figure the run's algorithm does not have) is
left out.
"""
from __future__ import annotations

import datetime
import itertools
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ddrl.errors import storage_errors

# The tables worth charts and their columns that are figures, not bookkeeping; `None`: every
# column but the bookkeeping ones.
TABLES: dict[str, tuple[str, ...] | None] = {
    "train": None,
    "eval": ("mean_return", "std_return", "max_return"),
    "episodes": ("return", "length"),
}
_BOOKKEEPING = {"update", "frames", "wall_time"}


def start_timestamp(start_time: Any) -> float:
    """The run's `start_time` attribute (ISO 8601) as a Unix time; 0 where it is missing."""
    try:
        return datetime.datetime.fromisoformat(str(start_time)).timestamp()
    except ValueError:
        return 0.0


def points(table: str, rows: Any, columns: list[str]) -> Iterator[tuple[int, float, dict[str, float]]]:
    """(frames, wall_time, {tag: value}) of each row of one table, its finite figures only.
    `rows` is anything indexed by column name (a structured array, a DataFrame); `columns`
    are the names it has."""
    if table not in TABLES or not len(rows):
        return
    wanted = TABLES[table] or [c for c in columns if c not in _BOOKKEEPING]
    figures = {f"{table}/{c}": np.asarray(rows[c], np.float64) for c in wanted}
    for i, (frames, wall_time) in enumerate(zip(np.asarray(rows["frames"]),
                                                np.asarray(rows["wall_time"]))):
        values = {tag: float(v[i]) for tag, v in figures.items() if math.isfinite(v[i])}
        if values:
            yield int(frames), float(wall_time), values


def scalars(table: str, rows: Any, columns: list[str]) -> Iterator[tuple[str, int, float, float]]:
    """(tag, frames, wall_time, value) of the rows of one table, as `points`."""
    for frames, wall_time, values in points(table, rows, columns):
        for tag, value in values.items():
            yield tag, frames, wall_time, value


class EventWriter:
    """One TensorBoard event file in `directory`, a new one for each writer (TensorBoard reads
    a directory's files in name order, so a resumed run's comes after). Written in the
    caller's thread, not TensorBoard's writer thread: a full disk is then the one-line error
    naming this file, which ends the run as the log's own failed write does, not a traceback
    from another thread."""

    _made = itertools.count()

    def __init__(self, directory: Path, start: float):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._session_log, self._summary = Event, SessionLog, Summary
        directory.mkdir(parents=True, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(self._made):04d}")
        self.path = directory / name
        self._file = open(self.path, "ab")
        self._records = RecordWriter(self._file)
        # The format version makes TensorBoard honour restart() below.
        self._add(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._start = start
        self.count = 0

    def _add(self, event) -> None:
        with storage_errors(self.path):
            self._records.write(event.SerializeToString())

    def restart(self, frames: int) -> None:
        """A resumed run: TensorBoard drops what the earlier events said from `frames` on (the
        checkpoint's frames + 1), which the run is about to play again."""
        self._add(self._event(wall_time=time.time(), step=frames, session_log=self._session_log(
            status=self._session_log.START)))

    def write(self, table: str, rows: Any, columns: list[str]) -> None:
        for tag, frames, wall_time, value in scalars(table, rows, columns):
            self._add(self._event(
                wall_time=self._start + wall_time, step=frames,
                summary=self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])))
            self.count += 1

    def flush(self) -> None:
        with storage_errors(self.path):
            self._file.flush()

    def close(self) -> None:
        self._file.close()
