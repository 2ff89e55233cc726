"""`ddrl bench target JOB.toml --out DIR [--seeds N] [--ranks R] [--set k=v ...]`: time to
score. The job runs to its `eval.target` for seeds 0..N-1, one after another, as the sweep
`run.seed=0`, `run.seed=1`, ... (`ddrl sweep`: DIR/seed_0, ...; run again, it skips the
finished runs and resumes a stopped one), then prints per seed and as the median the frames
and minutes to the confirmed target (when the weights that scored it over eval.confirm_episodes
games were taken) and when the run knew it, the first evaluation at the target, the online
figure, the frames/s of the whole run, evaluations included, and the CPU.
"""
from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ddrl.errors import DdrlError

if TYPE_CHECKING:  # pandas loads with the report, not with the command line's parser
    import pandas as pd


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file with an eval.target")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="the runs go to DIR/seed_0, DIR/seed_1, ...")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks per run (default 2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of every run (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ddrl.commands import sweep
    from ddrl.commands.info import cpu_summary
    from ddrl.placement import load_job

    if args.seeds < 1:
        raise DdrlError(f"--seeds {args.seeds}: at least 1")
    cfg = load_job(args.job, args.set)
    if cfg.eval.target is None:
        raise DdrlError(f"{args.job}: no eval.target to reach (set one with --set eval.target=X)")
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = args.out / "seeds.sweep"
    seeds.write_text("".join(f"run.seed={s}\n" for s in range(args.seeds)))
    # Through ddrl sweep's own parser, so that an option it gains has its default here too.
    parser = argparse.ArgumentParser(prog="ddrl sweep")
    sweep.add_arguments(parser)
    sets = [a for kv in args.set for a in ("--set", kv)]
    code = sweep.run(parser.parse_args([args.job, "--sweep", str(seeds), "--out",
                                        str(args.out / "seed"), "--ranks", str(args.ranks),
                                        *sets]))
    if code != 0:
        return code
    print(report(args.job, [args.out / f"seed_{s}" for s in range(args.seeds)], cfg.eval.target,
                 cpu_summary()))
    return 0


def report(job: str, run_dirs: list[Path], target: float, cpu: str) -> str:
    """Per seed and as the median: when the weights that confirmed the target were taken
    (frames, minutes), when the run knew it (minutes; the lag in seconds), the first evaluation
    at the target whether its confirmation held or not, the online figure (the mean of the last
    100 training games, the published PPO curves' protocol), the frames/s, and the evaluator's
    CPU share over the run and over the training to the confirmed weights. A seed that did not
    confirm the target reached it past its budget: its frames and minutes print as "> X", so
    does a median they bound, and a line under the table says where its last evaluation was."""
    import pandas as pd

    from analysis.load import load_run
    from analysis.scores import (
        detection_lag,
        eval_share,
        first_confirmed,
        median_bound,
        to_online_target,
        to_target,
    )

    lines = [f"ddrl bench target {job}: eval.target {target:g}, confirmed; {cpu}",
             f"{'seed':>6s}{'confirmed':>10s}{'frames':>14s}{'minutes':>9s}{'known at':>10s}"
             f"{'lag s':>7s}{'first at':>14s}{'online at':>14s}{'frames/s':>10s}"
             f"{'evaluations':>13s}{'eval CPU %':>12s}{'to weights':>12s}"]
    found: list[tuple[float, ...]] = []
    shares: list[tuple[float, float]] = []
    missed: list[str] = []
    confirmed: list[bool] = []
    for seed, run_dir in enumerate(run_dirs):
        run = load_run(run_dir)
        done = run.progress()
        rate = done.frames / done.wall_time if done.wall_time > 0 else math.nan
        hit = first_confirmed(run, target)
        confirmed.append(hit is not None)
        lag = detection_lag(run, target)
        if hit is not None:
            frames, minutes = float(hit["frames"]), float(hit["wall_time"]) / 60
            known = minutes + lag / 60
        else:
            # Its budget: the least the target would have taken it.
            frames, minutes = float(done.frames), done.wall_time / 60
            known = minutes
            missed.append(_missed(seed, run["eval"], done.frames))
        row = (frames, minutes, known, lag, to_target(run, target)[1],
               to_online_target(run, target)[1], rate)
        found.append(row)
        share = (100 * eval_share(run, done.wall_time),
                 100 * eval_share(run, minutes * 60, ended_by=True) if hit is not None
                 else math.nan)
        shares.append(share)
        reached = f"{hit['mean_return']:+.1f}" if hit is not None else "no"
        # The cut evaluations too: load_run keeps them apart, as no scores.
        played = len(run["eval"]) + len(run["eval_cut"])
        lines.append(f"{seed:6d}{reached:>10s}{_figures(row, (hit is None,) * 3)}{played:13d}"
                     f"{_shares(share)}")
    columns = list(zip(*found))
    # Frames, minutes and knowing: a missed seed at its budget bounds the median; the other
    # columns count a seed that never got there as infinitely slow, not as missing.
    bounded = [median_bound(pd.Series(col, dtype=float), pd.Series(confirmed))
               for col in columns[:3]]
    med = [v for v, _ in bounded] + [statistics.median(math.inf if math.isnan(v) else v
                                                       for v in col) for col in columns[3:]]
    bound = tuple(not exact for _, exact in bounded)
    # A share is a run's cost, not its speed: the median of the runs that have one.
    med_share = [statistics.median(v) if v else math.nan
                 for v in ([x for x in col if math.isfinite(x)] for col in zip(*shares))]
    lines.append(f"{'median':>6s}{f'{sum(confirmed)}/{len(found)}':>10s}"
                 f"{_figures(med, bound)}{'':13s}{_shares(med_share)}")
    return "\n".join(lines + missed)


def _missed(seed: int, evals: pd.DataFrame, frames: int) -> str:
    """Where a seed that missed the target stood: the evaluation of its newest weights (a
    backfilled one is logged late) and its best."""
    if evals.empty:
        return f"seed {seed}: not confirmed in its {frames:,} frames, no evaluation played"
    last, best = evals.loc[evals["frames"].idxmax()], evals.loc[evals["mean_return"].idxmax()]
    text = f"seed {seed}: not confirmed in its {frames:,} frames; the last evaluation {_eval(last)}"
    return text if best["mean_return"] == last["mean_return"] else f"{text}, the best {_eval(best)}"


def _eval(row: pd.Series) -> str:
    return (f"{row['mean_return']:+.1f} over {int(row['episodes'])} games at "
            f"{int(row['frames']):,} frames")


def _shares(shares) -> str:
    return "".join(f"{v:12.1f}" if math.isfinite(v) else f"{'-':>12s}" for v in shares)


def _figures(row, bound: tuple[bool, ...] = ()) -> str:
    """The report's figures in their columns; "-" where there is none (a target not reached,
    a median past the seeds that reached it), "> X" where X is only a lower bound."""
    columns = ((14, ",.0f"), (9, ".1f"), (10, ".1f"), (7, ".0f"), (14, ",.0f"), (14, ",.0f"),
               (10, ",.0f"))
    bound = bound + (False,) * (len(columns) - len(bound))
    return "".join(f"{'-':>{width}s}" if not math.isfinite(v)
                   else f"{'> ' + format(v, spec):>{width}s}" if low
                   else f"{v:{width}{spec}}"
                   for v, (width, spec), low in zip(row, columns, bound))
