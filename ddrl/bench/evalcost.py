"""`ddrl bench eval JOB.toml [--from RUN_DIR] [--ranks N] [--seconds S] [--pairs P]`: what the
background evaluation costs a run. The job runs `ddrl train` windows with its evaluations off
and on, alternating (off, on, off, on, ...), so that drifting load weighs on both; the cost is
the frames/s lost with them on. `--from` resumes a copy of a run from its latest checkpoint in
each window: a trained agent's games are longer than a new one's, and so are its evaluations.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ddrl.errors import DdrlError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file")
    p.add_argument("--from", dest="start_from", type=Path, metavar="RUN_DIR",
                   help="start each window from this run's latest checkpoint (a copy of it)")
    p.add_argument("--seconds", type=float, default=120.0,
                   help="measured seconds of each window (default 120)")
    p.add_argument("--pairs", type=int, default=2, help="off/on pairs of windows (default 2)")
    p.add_argument("--ranks", type=int, default=1, help="mpirun -n N on this machine")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every window (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.node import measure_training
    from ddrl.commands.info import cpu_summary
    from ddrl.cpus import cores_per_rank
    from ddrl.envs import frames_per_step
    from ddrl.placement import load_job

    if args.seconds <= 0 or args.pairs < 1 or args.ranks < 1:
        raise DdrlError("--seconds must be > 0, --pairs and --ranks >= 1")
    if args.start_from is not None and not args.start_from.is_dir():
        raise DdrlError(f"--from {args.start_from}: no such run directory")
    cfg = load_job(args.job, args.set)
    if not cfg.eval.episodes:
        raise DdrlError(f"{args.job}: eval.episodes = 0, nothing to measure")
    print(f"ddrl bench eval {args.job}: {cfg.env.id}, {args.ranks} rank(s), {cpu_summary()}; "
          f"{cfg.eval.episodes} games every {cfg.eval.every} updates, eval.cpu_share "
          f"{cfg.eval.cpu_share:g}, eval.nice {cfg.eval.nice}; "
          f"{args.seconds:g} s windows" + (f" from {args.start_from}" if args.start_from else ""),
          flush=True)
    print(f"{'window':10s}{'frames/s':>10s}{'evaluations':>13s}{'s each':>8s}{'CPU s each':>12s}"
          f"{'CPU share of a rank':>21s}", flush=True)
    rates: dict[bool, list[float]] = {False: [], True: []}
    cores = cores_per_rank(cfg.acting.threads, args.ranks)
    for pair in range(args.pairs):
        for on in (False, True):
            fig = measure_training(args.job, args.set, args.seconds, frames_per_step(cfg),
                                   args.ranks, evaluate=on, start_from=args.start_from)
            rates[on].append(fig.frames)
            label = f"{'on' if on else 'off'} #{pair + 1}"
            if not on:
                print(f"{label:10s}{fig.frames:10,.0f}", flush=True)
                continue
            ev = fig.evals
            each = (f"{ev['seconds'].mean():8.1f}{ev['cpu_seconds'].mean():12.2f}" if len(ev)
                    else f"{'-':>8s}{'-':>12s}")
            share = ev["cpu_seconds"].sum() / (args.seconds * cores)
            print(f"{label:10s}{fig.frames:10,.0f}{len(ev):13d}{each}{share:21.1%}", flush=True)
    off, on = (np.array(rates[k]) for k in (False, True))
    print(f"evaluation on / off: {on.sum() / off.sum():.3f} of the frames/s "
          f"(pairs: {', '.join(f'{a / b:.3f}' for a, b in zip(on, off))}); "
          f"the evaluator costs {1 - on.sum() / off.sum():.1%}")
    return 0

