"""`ddrl bench offpolicy JOB.toml`: what V-trace's correction is worth under heavy policy lag.

The same job on the ba3c node with a deep experience FIFO (`--queue` steps), once per
algorithm and seed, each for the same frames (no early stop at the target): the log's policy
lag, the frames at which the greedy eval first reached the target, the best and the last
evals. The runs stay under `--out` with their curves (`offpolicy-curves.png`).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ddrl.errors import DdrlError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file")
    p.add_argument("--out", required=True, help="directory for the runs and the curves")
    p.add_argument("--algos", nargs="+", default=["a2c", "vtrace"],
                   help="algo.name of each variant (default: a2c vtrace)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="run.seed values")
    p.add_argument("--queue", type=int, default=4096,
                   help="acting.queue_size: steps the FIFO holds (default 4096)")
    p.add_argument("--frames", type=int, required=True, help="run.max_frames of every run")
    p.add_argument("--ranks", type=int, default=1, help="ranks per run under mpirun (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run (repeatable)")


def settings(args: argparse.Namespace, algo: str, seed: int) -> list[str]:
    return [*args.set, "acting.mode=ba3c", f"acting.queue_size={args.queue}", f"algo.name={algo}",
            f"run.seed={seed}", f"run.max_frames={args.frames}", "eval.target=none",
            "run.progress_seconds=1e6"]


def train(args: argparse.Namespace, algo: str, seed: int, out: Path) -> None:
    from ddrl.bench import runs
    from ddrl.distributed.launch import mpirun_command

    launch = mpirun_command(args.ranks) if args.ranks > 1 else []
    runs.train(launch, args.job, out, settings(args, algo, seed), f"{algo} seed {seed}")


def run(args: argparse.Namespace) -> int:
    from analysis.load import load_run
    from analysis.plots import plot_learning_curves, save
    from analysis.scores import first_reaching
    from ddrl.placement import load_job

    cfg = load_job(args.job, args.set)
    target = cfg.eval.target
    for algo in args.algos:  # every variant's settings refused now, not after hours of runs
        load_job(args.job, settings(args, algo, args.seeds[0]))
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise DdrlError(f"--out {out}: not empty (the runs would mix with earlier ones)")
    print(f"[ddrl] offpolicy: {cfg.env.id}, ba3c node, FIFO of {args.queue} steps, "
          f"{args.frames:,} frames per run, algos {' '.join(args.algos)}, seeds "
          f"{' '.join(map(str, args.seeds))}", flush=True)
    print(f"{'algo':<8}{'seed':>5}{'mean lag':>10}{'to target':>12}{'best eval':>11}"
          f"{'last eval':>11}", flush=True)
    runs, labels, rows = [], [], []
    for algo in args.algos:
        for seed in args.seeds:
            path = out / f"{algo}-s{seed}"
            train(args, algo, seed, path)
            r = load_run(path)
            evals = r["eval"]
            hit = first_reaching(evals, target) if target is not None and len(evals) else None
            to_target = np.nan if hit is None else float(hit["frames"])
            best = float(evals["mean_return"].max()) if len(evals) else np.nan
            last = float(evals["mean_return"].iloc[-1]) if len(evals) else np.nan
            lag = float(r["train"]["policy_lag"].mean())
            rows.append((algo, lag, to_target, best, last))
            runs.append(r)
            labels.append(f"{algo} s{seed}")
            print(f"{algo:<8}{seed:>5}{lag:>10.1f}{to_target:>12,.0f}{best:>11.1f}{last:>11.1f}",
                  flush=True)
    print(f"{'algo':<8}{'mean lag':>10}{'reached':>9}{'best eval':>16}{'last eval':>16}")
    for algo in args.algos:
        mine = np.array([row[1:] for row in rows if row[0] == algo])
        reached = int(np.isfinite(mine[:, 1]).sum())
        print(f"{algo:<8}{mine[:, 0].mean():>10.1f}{reached:>5}/{len(mine):<3}"
              f"{mine[:, 2].mean():>9.1f} +-{mine[:, 2].std():>5.1f}"
              f"{mine[:, 3].mean():>9.1f} +-{mine[:, 3].std():>5.1f}")
    path = save(plot_learning_curves(runs, labels, target), out / "offpolicy-curves.png")
    print(f"curves: {path}")
    return 0
