"""`ddrl bench paused-eval RUN_DIR [--episodes 10 40] [--sims 0 4] [--cores C] [--rounds R]
[--simulators new kept] [--weights CKPT] [--cut]`: seconds per evaluation while the ranks wait
(eval.focus_above, a crossing's confirmation), the simulators' layouts side by side on a run's
best weights: each number of simulators (0: the evaluator's own choice, `eval_simulators`) in
one inference batch and in two pipelined halves, on simulators made for the evaluation or kept
from the one before (the evaluator's), interleaved round after round so that drifting load
weighs on all. Every game is played to its end (weights near the target, whose games are
rarely cut, are what the wait is made of), or with `--cut` stopped as the run stops it
(eval.target, eval.max_return): early weights' evaluations, where the simulators' start-up
is most of the wait."""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np

from ddrl.commands.args import positive_int
from ddrl.errors import DdrlError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run directory with checkpoints/best.npz")
    p.add_argument("--episodes", type=positive_int, nargs="+", default=[10, 40],
                   help="games per evaluation (default: 10, a focused one, and 40, a "
                        "confirmation's rest)")
    p.add_argument("--sims", type=int, nargs="+", default=[0],
                   help="simulators to play them on (0: the evaluator's own; default 0)")
    p.add_argument("--cores", type=positive_int, default=len(os.sched_getaffinity(0)),
                   help="the cores the evaluation has (default: this process's)")
    p.add_argument("--rounds", type=positive_int, default=2, help="rounds of all (default 2)")
    p.add_argument("--simulators", nargs="+", choices=("new", "kept"), default=["new", "kept"],
                   help="simulators made for each evaluation, kept from the one before (the "
                        "evaluator's), or both (default)")
    p.add_argument("--weights", type=Path,
                   help="a checkpoint to play instead of the run's best (a file in RUN_DIR/"
                        "checkpoints or a path)")
    p.add_argument("--cut", action="store_true",
                   help="stop each evaluation once the target is out of reach, as the run does")
    p.add_argument("--seed", type=int, default=1000)


def run(args: argparse.Namespace) -> int:
    from ddrl.commands.info import cpu_summary
    from ddrl.config import load_config
    from ddrl.envs import check_env_id, env_spec
    from ddrl.rundir import checkpoint

    best = args.run_dir / "checkpoints" / checkpoint.BEST
    if args.weights is not None:
        best = args.weights if args.weights.is_file() else \
            args.run_dir / "checkpoints" / args.weights
        if not best.is_file():
            raise DdrlError(f"--weights {args.weights}: no such checkpoint")
    elif not best.is_file():
        raise DdrlError(f"{args.run_dir}: no checkpoints/{checkpoint.BEST} (a run that has "
                        f"evaluated)")
    if any(s < 0 for s in args.sims):
        raise DdrlError("--sims must be >= 0")
    cfg = load_config(args.run_dir / "config.toml", check_env=check_env_id)
    ckpt = checkpoint.load(best)
    from ddrl.cpus import configure_tensorflow

    # As the evaluator process: one TensorFlow thread, the emulator's threads a core each.
    configure_tensorflow(1, False)
    from ddrl.learner import Learner
    from ddrl.loop.evaluator import Pools, eval_simulators, evaluate, out_of_reach, pipelined_batch

    learner = Learner(cfg, *env_spec(cfg))
    learner.set_weights(ckpt.weights)
    print(f"ddrl bench paused-eval {args.run_dir}: {best.name}'s weights at {ckpt.frames:,} "
          f"frames, {args.cores} core(s), {'cut as the run cuts' if args.cut else 'whole games'}, "
          f"{cpu_summary()}", flush=True)
    print(f"{'games':>6s}{'sims':>6s}{'batch':>7s}{'simulators':>11s}{'seconds':>9s}{'mean':>8s}"
          f"{'agent steps':>13s}", flush=True)
    layouts = [(n, s or eval_simulators(n, args.cores), halves, made)
               for n in args.episodes for s in args.sims for halves in (False, True)
               for made in args.simulators]
    seconds: dict[tuple, list[float]] = {layout: [] for layout in layouts}
    # Each layout's kept simulators, made before the rounds: the evaluator makes them once
    # a run.
    kept = {layout: Pools() for layout in layouts if layout[3] == "kept"}
    made_only = threading.Event()
    made_only.set()  # an evaluation stopped before its first step: its simulators made
    try:
        for (n, sims, halves, _), pools in kept.items():
            evaluate(cfg, learner, n, args.seed, made_only, cores=args.cores, sims=sims,
                     halves=halves, pools=pools)
        for r in range(args.rounds):
            for layout in layouts:
                n, sims, halves, made = layout
                started = time.monotonic()
                res = evaluate(cfg, learner, n, args.seed + r,
                               give_up=out_of_reach(cfg, n) if args.cut else None,
                               cores=args.cores, sims=sims, halves=halves, pools=kept.get(layout))
                seconds[layout].append(time.monotonic() - started)
                batch = (pipelined_batch(cfg, sims) if halves else 0) or sims
                print(f"{n:6d}{sims:6d}{batch:7d}{made:>11s}{seconds[layout][-1]:9.2f}"
                      f"{res.mean:8.2f}{int(res.actions.sum()):13,d}", flush=True)
    finally:
        for pools in kept.values():
            pools.close()
    for n in args.episodes:
        first = next(layout for layout in layouts if layout[0] == n)
        base = float(np.median(seconds[first]))
        print(f"{n} games, median seconds (ratio to {first[1]} simulators in one batch, "
              f"{first[3]}): " +
              ", ".join(f"{s} sims {'halves' if h else 'one batch'} {made} {np.median(v):.2f} "
                        f"({np.median(v) / base:.2f})"
                        for (m, s, h, made), v in seconds.items() if m == n))
    return 0
