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

from ddrl.errors import DdrlError


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
    CPU share over the run and over the training to the confirmed weights."""
    from analysis.load import load_run
    from analysis.scores import (
        detection_lag,
        eval_share,
        first_confirmed,
        to_online_target,
        to_target,
    )

    lines = [f"ddrl bench target {job}: eval.target {target:g}, confirmed; {cpu}",
             f"{'seed':>6s}{'confirmed':>10s}{'frames':>14s}{'minutes':>9s}{'known at':>10s}"
             f"{'lag s':>7s}{'first at':>14s}{'online at':>14s}{'frames/s':>10s}"
             f"{'evaluations':>13s}{'eval CPU %':>12s}{'to weights':>12s}"]
    found: list[tuple[float, ...]] = []
    shares: list[tuple[float, float]] = []
    for seed, run_dir in enumerate(run_dirs):
        run = load_run(run_dir)
        done = run.progress()
        rate = done.frames / done.wall_time if done.wall_time > 0 else math.nan
        hit = first_confirmed(run, target)
        frames, minutes = ((float(hit["frames"]), float(hit["wall_time"]) / 60)
                           if hit is not None else (math.nan, math.nan))
        lag = detection_lag(run, target)
        known = minutes + lag / 60
        row = (frames, minutes, known, lag, to_target(run, target)[1],
               to_online_target(run, target)[1], rate)
        found.append(row)
        share = (100 * eval_share(run, done.wall_time),
                 100 * eval_share(run, minutes * 60, ended_by=True))
        shares.append(share)
        reached = f"{hit['mean_return']:+.1f}" if hit is not None else "no"
        # The cut evaluations too: load_run keeps them apart, as no scores.
        played = len(run["eval"]) + len(run["eval_cut"])
        lines.append(f"{seed:6d}{reached:>10s}{_figures(row)}{played:13d}{_shares(share)}")
    # A seed that never reached the target counts as infinitely slow, not as missing.
    med = [statistics.median(math.inf if math.isnan(v) else v for v in col)
           for col in zip(*found)]
    # A share is a run's cost, not its speed: the median of the runs that have one.
    med_share = [statistics.median(v) if v else math.nan
                 for v in ([x for x in col if math.isfinite(x)] for col in zip(*shares))]
    reached = sum(not math.isnan(f[0]) for f in found)
    lines.append(f"{'median':>6s}{f'{reached}/{len(found)}':>10s}{_figures(med)}{'':13s}"
                 f"{_shares(med_share)}")
    return "\n".join(lines)


def _shares(shares) -> str:
    return "".join(f"{v:12.1f}" if math.isfinite(v) else f"{'-':>12s}" for v in shares)


def _figures(row) -> str:
    """The report's figures in their columns; "-" where there is none (a target not reached,
    a median past the seeds that reached it)."""
    columns = ((14, ",.0f"), (9, ".1f"), (10, ".1f"), (7, ".0f"), (14, ",.0f"), (14, ",.0f"),
               (10, ",.0f"))
    return "".join(f"{v:{width}{spec}}" if math.isfinite(v) else f"{'-':>{width}s}"
                   for v, (width, spec) in zip(row, columns))
