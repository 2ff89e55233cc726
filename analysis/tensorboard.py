"""`ddrl export --tensorboard DIR RUN...`: a run's HDF5 log as TensorBoard event files, the
same scalars a run writes live (`ddrl/rundir/tensorboard.py`). Each run gets `DIR/<run name>/`."""
from __future__ import annotations

import argparse
from pathlib import Path

from analysis.load import Run, load_runs
from ddrl.errors import DdrlError
from ddrl.rundir.tensorboard import TABLES, EventWriter, start_timestamp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensorboard", type=Path, required=True, metavar="DIR",
                        help="directory for the event files (one subdirectory per run)")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or log.h5 files")


def export(run: Run, out: Path) -> int:
    writer = EventWriter(out, start_timestamp(run.attrs.get("start_time")))
    try:
        for table in TABLES:
            rows = run[table]
            writer.write(table, rows, list(rows.columns))
    finally:
        writer.close()
    return writer.count


def run(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs)
    try:
        args.tensorboard.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DdrlError(f"--tensorboard {args.tensorboard}: cannot create it ({exc.strerror})") from None
    for r in runs:
        # A name may be a path's last parts (two sweeps' `seed_0`), or a whole absolute path
        # (one run given twice): its parts make one folder name inside DIR, never a path out.
        out = args.tensorboard / "_".join(p for p in Path(r.name).parts if p not in ("/", ".."))
        n = export(r, out)
        print(f"wrote {n} scalars of {r.name} to {out}")
    return 0
