"""`ddrl export --tensorboard DIR RUN...`: a run's HDF5 log as TensorBoard event files.

Each run gets `DIR/<run name>/`. Scalars are stepped by frames (the x axis of every curve
here) and stamped with the run's own wall clock (start_time + wall_time), so TensorBoard's
"relative" axis shows training time, not the time of the export.
"""
from __future__ import annotations

import argparse
import datetime
import math
from pathlib import Path

from analysis.load import Run, load_runs
from ddrl.errors import DdrlError

# /train columns that are bookkeeping, not figures worth a chart.
_SKIP = {"update", "frames", "wall_time"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensorboard", type=Path, required=True, metavar="DIR",
                        help="directory for the event files (one subdirectory per run)")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or log.h5 files")


def _start(run: Run) -> float:
    try:
        return datetime.datetime.fromisoformat(str(run.attrs.get("start_time"))).timestamp()
    except ValueError:
        return 0.0


def _series(tag: str, table, column: str):
    for frames, wall_time, value in zip(table["frames"], table["wall_time"], table[column]):
        if math.isfinite(value):
            yield tag, int(frames), float(wall_time), float(value)


def scalars(run: Run):
    """(tag, frames, wall_time offset, value) of every figure the log holds; NaN (a figure
    the run's algorithm does not have) is left out."""
    train = run["train"]
    for column in train.columns:
        if column not in _SKIP:
            yield from _series(f"train/{column}", train, column)
    for column in ("mean_return", "std_return", "max_return"):
        yield from _series(f"eval/{column}", run["eval"], column)
    for column in ("return", "length"):
        yield from _series(f"episodes/{column}", run["episodes"], column)


def export(run: Run, out: Path) -> int:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    start = _start(run)
    writer = EventFileWriter(str(out))
    count = 0
    try:
        for tag, frames, wall_time, value in scalars(run):
            writer.add_event(Event(wall_time=start + wall_time, step=int(frames), summary=Summary(
                value=[Summary.Value(tag=tag, simple_value=value)])))
            count += 1
    finally:
        writer.close()
    return count


def run(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs)
    try:
        args.tensorboard.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DdrlError(f"--tensorboard {args.tensorboard}: cannot create it ({exc.strerror})") from None
    for r in runs:
        # Colliding names are the paths given, maybe absolute: their parts make one folder
        # name inside DIR, never a path out of it.
        out = args.tensorboard / "_".join(p for p in Path(r.name).parts if p not in ("/", ".."))
        n = export(r, out)
        print(f"wrote {n} scalars of {r.name} to {out}")
    return 0
