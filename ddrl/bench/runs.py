"""Real `ddrl train` runs started by the benchmarks: the command line, a measuring window after
a warm-up, and one line naming the failure when a run fails."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ddrl.errors import DdrlError

TRACEBACK_END = re.compile(r"^[\w.]+(Error|Exception): ")
DDRL_ERROR = re.compile(r"^ddrl: error: ")


def first_error(output: str) -> str:
    """A rank's own error line rather than the launcher's banner that follows it: the end of
    a traceback, else a `ddrl: error:` line, else the last line."""
    lines = output.strip().splitlines() or ["no output"]
    for pattern in (TRACEBACK_END, DDRL_ERROR):
        found = [line for line in lines if pattern.match(line)]
        if found:
            return found[0]
    return lines[-1]


def train(launch: list[str], job: str, out: Path, sets: list[str], label: str) -> None:
    """`ddrl train JOB --out OUT --set ...` under `launch` (an mpirun command, or [])."""
    cmd = [*launch, sys.executable, "-m", "ddrl", "train", job, "--out", str(out),
           *(arg for s in sets for arg in ("--set", s))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DdrlError(f"{label} exited with {proc.returncode}: "
                        f"{first_error(proc.stdout + proc.stderr)}")


def timed_rows(launch: list[str], job: str, sets: list[str], seconds: float, table: str,
               label: str) -> tuple[np.ndarray, float]:
    """A run of warm-up + `seconds` without evaluations or checkpoints, one log row per
    update; its `table` rows after the warm-up, and the warm-up in seconds."""
    tables, warmup = timed_tables(launch, job, sets, seconds, (table,), label)
    return tables[table], warmup


def timed_tables(launch: list[str], job: str, sets: list[str], seconds: float,
                 tables: tuple[str, ...], label: str) -> tuple[dict[str, np.ndarray], float]:
    """`timed_rows` for several tables at once."""
    import h5py

    from ddrl.bench.node import warmup_seconds

    warmup = warmup_seconds(seconds)
    timed = [*sets, f"run.max_minutes={(warmup + seconds) / 60}", "run.max_frames=1000000000000",
             "eval.episodes=0", "eval.target=none", "run.log_every=1",
             "run.checkpoint_minutes=1e6", "run.progress_seconds=1e6"]
    with tempfile.TemporaryDirectory(prefix="ddrl-bench-") as tmp:
        out = Path(tmp) / "run"
        train(launch, job, out, timed, label)
        with h5py.File(out / "log.h5", "r") as f:
            rows = {name: f[name][:] for name in tables}
    return {name: r[r["wall_time"] >= warmup] for name, r in rows.items()}, warmup
