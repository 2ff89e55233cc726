"""`ddrl bench dqn [JOB]`: the concurrent-DQN paper's speed test (its Table 1) on this machine.

Each variant (standard, concurrent, synchronized, both) at each number of samplers W runs as
a real `ddrl train` of the job at a fixed epsilon (0.1, as the paper's test), and its
steady-state rate of agent steps gives the time of 1M agent steps. All variants run in one
invocation, one after the other, so their ratios share the machine's state.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ddrl.errors import DdrlError

DEFAULT_JOB = Path(__file__).resolve().parents[2] / "jobs" / "pong-dqn.toml"
VARIANTS = {
    "standard": ("dqn.concurrent=false", "dqn.synchronized=false"),
    "concurrent": ("dqn.concurrent=true", "dqn.synchronized=false"),
    "synchronized": ("dqn.concurrent=false", "dqn.synchronized=true"),
    "both": ("dqn.concurrent=true", "dqn.synchronized=true"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", nargs="?", default=str(DEFAULT_JOB),
                   help="DQN job file (default: jobs/pong-dqn.toml)")
    p.add_argument("--samplers", type=int, nargs="*", default=[1, 2, 4], help="values of W")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seconds", type=float, default=120.0,
                   help="measured seconds per variant, after a warm-up (default 120)")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of every variant (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.node import measure_training
    from ddrl.config import load_config
    from ddrl.info import cpu_summary

    base = load_config(args.job, args.set)
    if base.algo.name != "dqn":
        raise DdrlError(f"{args.job}: not a DQN job (algo.name = {base.algo.name!r})")
    a = base.dqn
    print(f"ddrl bench dqn {args.job}: {base.env.id}, {base.model.arch}, minibatch "
          f"{base.node.batch_size}, train period {a.train_period}, target period "
          f"{a.target_period}, epsilon {args.epsilon:g}, {args.seconds:g} s per variant; "
          f"{cpu_summary()}", flush=True)
    hours: dict[tuple[str, int], float] = {}
    for w in args.samplers:
        for variant in args.variants:
            if variant in ("synchronized", "both") and w == 1:
                continue  # one sampler has nothing to synchronize with
            sets = [*args.set, *VARIANTS[variant], f"dqn.samplers={w}",
                    f"dqn.eps_start={args.epsilon}", f"dqn.eps_final={args.epsilon}"]
            load_config(args.job, sets)
            fig = measure_training(args.job, sets, args.seconds, base.env.frame_skip)
            # Updates, not frames: concurrent training adds its frames at each target update.
            steps_per_s = fig.data_points / base.node.batch_size * a.train_period
            hours[variant, w] = 1e6 / steps_per_s / 3600
            print(f"  W={w} {variant}: {steps_per_s:,.0f} agent steps/s, "
                  f"{fig.updates} updates measured", flush=True)
    print(format_table(hours, args.samplers, args.variants))
    return 0


def format_table(hours: dict[tuple[str, int], float], samplers: list[int],
                 variants: list[str]) -> str:
    """Hours per 1M agent steps, and each as a speed-up over standard DQN with one sampler."""
    base = hours.get(("standard", 1))
    lines = ["hours per 1M agent steps (speed-up over standard, W=1)",
             f"{'W':>3s}" + "".join(f"{v:>22s}" for v in variants)]
    for w in samplers:
        cells = []
        for v in variants:
            h = hours.get((v, w))
            if h is None:
                cells.append(f"{'-':>22s}")
            else:
                ratio = f" ({base / h:.2f}x)" if base else ""
                cells.append(f"{h:>14.2f}{ratio:>8s}")
        lines.append(f"{w:>3d}" + "".join(cells))
    return "\n".join(lines)
