"""`ddrl status RUN...`: one line per run, read from its live log: state, frames and share of
the frame budget, recent frames/s, last and best evaluation, time to target, restarts, and
time left for a running run. A RUN is a run directory, its log.h5, or a directory of runs (a
sweep's or a job array's parent): each subdirectory with a log counts."""
from __future__ import annotations

import argparse
import fcntl
import math
from pathlib import Path

from analysis.load import LOG_NAME, Run, load_run, run_names
from analysis.scores import to_target
from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint, held_by_a_run
from ddrl.rundir.log import left_open

CANNOT_TELL = "cannot tell"
# frames/s over the last this many seconds of the run's /train rows.
RECENT_SECONDS = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directories, their log.h5 files, or directories of runs")


def expand(paths: list[str]) -> list[Path]:
    """The run directories named or held by `paths`, in order."""
    found = []
    for text in paths:
        path = Path(text)
        if path.is_file():
            found.append(path.parent)
        elif (path / LOG_NAME).is_file():
            found.append(path)
        elif path.is_dir() and (runs := sorted(p.parent for p in path.glob(f"*/{LOG_NAME}"))):
            found += runs
        else:
            raise DdrlError(f"{path}: no run there (no {LOG_NAME} in it or in its subdirectories)")
    return found


def running(run_dir: Path) -> bool | None:
    """Whether a process holds the run directory's lock (ddrl train holds it for its life);
    None where it cannot be told (the lock file unreadable from here: a stale NFS handle).
    A shared lock, taken and dropped at once: a run starting in that instant retries."""
    try:
        with open(run_dir / ".lock") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no lock file (a run from before locks, or never started), no flock here
        pass
    # The lock file's heartbeat: where flock is unsupported or local to another node.
    return held_by_a_run(run_dir)


def _fmt(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def _clock(seconds: float) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def line(run_dir: Path, name: str | None = None) -> list[str]:
    """The run's cells, or for a log that cannot be read its name, state and why."""
    name = name or run_dir.name
    live = running(run_dir)
    try:
        run = load_run(run_dir)
    except DdrlError as exc:
        # A log being written, read from another node of a shared filesystem, can look torn
        # for a moment: only the log of a run known to have ended is damaged.
        if live is not False:
            return [name, CANNOT_TELL if live is None else "running",
                    f"the log cannot be read now ({exc})"]
        return [name, "damaged", str(exc)]
    if live is None:
        return [name, CANNOT_TELL, "whether a run holds it: its lock file cannot be "
                "read from here (a stale NFS handle or a storage fault); its log reads"]
    progress = run.progress()
    saved = _saved_frames(run_dir)
    # Killed before it closed its log: a resume goes on from the last checkpoint, and the
    # log's rows past it are dropped then.
    killed = not live and left_open(run_dir / LOG_NAME)
    # The log's last /train row trails the run by up to run.log_every updates; its last
    # checkpoint does not (the final one is of the last update).
    frames = saved if killed else max(progress.frames, saved)
    budget = int(run.setting("run.max_frames", 0)) or None
    minutes = float(run.setting("run.max_minutes", 0.0))
    t_target, _ = to_target(run, None)
    at_end = (budget is not None and frames >= budget) or not math.isnan(t_target)
    finished = at_end or (minutes > 0 and progress.wall_time >= minutes * 60)
    # A run cut while it played the weights it owed (after its budget or its hit) is not done:
    # its resume plays them, and they may move its time to target earlier.
    owed = _owed(run_dir) if at_end and not live else 0
    state = "running" if live else "requeued" if _requeued(run_dir) else \
        "killed" if killed else "finished" if finished and not owed else "stopped"
    fps = _recent_rate(run)
    # Time left, running runs only: to the frame budget at the recent rate, or the time limit.
    ends = [(budget - frames) / fps] if live and fps and budget else []
    ends += [minutes * 60 - progress.wall_time] if live and minutes > 0 else []
    left = f"{owed} evals" if owed else _clock(min(ends)) if ends else "-"
    evals = run["eval"]["mean_return"]
    return [name, state,
            f"{frames:,}" + (f" ({frames / budget:.0%})" if budget else ""),
            _fmt(fps, ",.0f"), _last_eval(run),
            _fmt(evals.max() if len(evals) else None, ".1f"), _clock(t_target),
            str(int(run.attrs.get("restarts", 0))), left]


def _last_eval(run: Run) -> str:
    """The latest evaluation's mean, a cut one's too (marked, as `ddrl train` prints it): a
    run far from its target cuts every evaluation (`eval.max_return`), and its user would
    otherwise see no evaluation at all for hours. The best stays that of whole evaluations."""
    whole, cut = run["eval"], run.tables.get("eval_cut")
    last_whole = whole["update"].iloc[-1] if len(whole) else -1
    if cut is not None and len(cut) and cut["update"].iloc[-1] > last_whole:
        return f"{cut['mean_return'].iloc[-1]:.1f} (cut)"
    return _fmt(whole["mean_return"].iloc[-1] if len(whole) else None, ".1f")


def _requeued(run_dir: Path) -> bool:
    """The batch script requeued the job (its launch.sh wrote DIR/requeued) and the resumed
    run has not started yet (it rebuilds the log first)."""
    try:
        return (run_dir / "requeued").stat().st_mtime >= (run_dir / "log.h5").stat().st_mtime
    except OSError:
        return False


def _owed(run_dir: Path) -> int:
    try:
        return checkpoint.unplayed_count(run_dir / "checkpoints")
    except DdrlError:  # damaged: the log says where the run stands; a resume names the file
        return 0


def _saved_frames(run_dir: Path) -> int:
    saved = checkpoint.latest(run_dir / "checkpoints")
    try:
        return checkpoint.read_meta(saved)["frames"] if saved else 0
    except DdrlError:  # damaged: the log's figure stands
        return 0


def _recent_rate(run: Run) -> float | None:
    train = run["train"]
    if len(train) < 2:
        return None
    recent = train[train["wall_time"] >= train["wall_time"].iloc[-1] - RECENT_SECONDS]
    if len(recent) < 2:
        recent = train.iloc[-2:]
    span = recent["wall_time"].iloc[-1] - recent["wall_time"].iloc[0]
    return float((recent["frames"].iloc[-1] - recent["frames"].iloc[0]) / span) if span > 0 else None


def run(args: argparse.Namespace) -> int:
    header = ["run", "state", "frames", "frames/s", "last eval", "best eval", "to target",
              "restarts", "left"]
    dirs = expand(args.runs)
    rows = [header, *map(line, dirs, run_names(dirs))]
    widths = [max(len(r[i]) for r in rows if len(r) > i and len(r) == len(header))
              for i in range(len(header))]
    for r in rows:
        if len(r) == len(header):
            print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                            for i, (cell, w) in enumerate(zip(r, widths))).rstrip())
        else:  # damaged or unknown: its name, its state and why
            print(f"{r[0].ljust(widths[0])}  {r[1]}  {r[2]}")
    return 0
