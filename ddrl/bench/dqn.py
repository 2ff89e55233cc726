"""`ddrl bench dqn [JOB]`: the concurrent-DQN paper's speed test (its Table 1) on this machine.

Each variant (standard, concurrent, synchronized, both) at each number of samplers W runs as
a real `ddrl train` of the job at a fixed epsilon (0.1, as the paper's test), and its
steady-state rate of agent steps gives the time of 1M agent steps. All variants run in one
invocation, one after the other, so their ratios share the machine's state.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ddrl.errors import DdrlError

if TYPE_CHECKING:
    from ddrl.config import Config

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
    p.add_argument("--calls", type=int, nargs="*", metavar="BATCH",
                   help="instead of the speed test: the time of each compiled call of an update "
                        "on one core, at these minibatch sizes (none named: the job's)")


CALL_REPEATS = 200


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.node import measure_training
    from ddrl.commands.info import cpu_summary
    from ddrl.placement import load_job

    base = load_job(args.job, args.set)
    if base.algo.name != "dqn":
        raise DdrlError(f"{args.job}: not a DQN job (algo.name = {base.algo.name!r})")
    if args.calls is not None:
        if any(size < 1 for size in args.calls):
            raise DdrlError(f"--calls {' '.join(map(str, args.calls))}: minibatch sizes are >= 1")
        return time_calls(base, args.calls or [base.acting.batch_size], args.job)
    a = base.dqn
    print(f"ddrl bench dqn {args.job}: {base.env.id}, {base.model.arch}, minibatch "
          f"{base.acting.batch_size}, train period {a.train_period}, target period "
          f"{a.target_period}, epsilon {args.epsilon:g}, {args.seconds:g} s per variant; "
          f"{cpu_summary()}", flush=True)
    hours: dict[tuple[str, int], float] = {}
    for w in args.samplers:
        for variant in args.variants:
            if variant in ("synchronized", "both") and w == 1:
                continue  # one sampler has nothing to synchronize with
            sets = [*args.set, *VARIANTS[variant], f"dqn.samplers={w}",
                    f"dqn.eps_start={args.epsilon}", f"dqn.eps_final={args.epsilon}"]
            load_job(args.job, sets)
            fig = measure_training(args.job, sets, args.seconds, base.env.frame_skip)
            # Updates, not frames: concurrent training adds its frames at each target update.
            steps_per_s = fig.data_points / base.acting.batch_size * a.train_period
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


def time_calls(cfg: Config, batch_sizes: list[int], job: str) -> int:
    """What an update of one rank costs, call by call, on one core (as a rank bound to it):
    the samplers' inference, the next observations' values, the gradient, Adam's step; on
    random observations, each call timed over CALL_REPEATS after a warm-up."""
    import time
    from functools import partial

    import numpy as np

    from ddrl.bench.node import synthetic_batch
    from ddrl.commands.info import cpu_summary
    from ddrl.cpus import configure_tensorflow
    from ddrl.envs import env_spec

    if cfg.dqn.recurrent:
        raise DdrlError(f"{job}: --calls times feed-forward DQN updates; this job is recurrent")
    configure_tensorflow(1, False)
    from ddrl.learner import Learner

    obs_shape, obs_dtype, n_actions = env_spec(cfg)
    learner = Learner(cfg, obs_shape, obs_dtype, n_actions)
    target = learner.frozen_copy()
    next_values = learner.beside(target) if cfg.dqn.double else target.predict
    rng = np.random.default_rng(0)
    print(f"ddrl bench dqn --calls {job}: {cfg.env.id}, {cfg.model.arch}, {cfg.model.precision}, "
          f"{learner.num_params:,} params, 1 core, ms per call; {cpu_summary()}")
    print(f"{'batch':>6s}{'act':>9s}{'next values':>13s}{'gradients':>11s}{'apply':>8s}"
          f"{'update':>9s}{'per sample':>12s}")

    def ms(call) -> float:
        for _ in range(CALL_REPEATS // 10):
            call()
        start = time.perf_counter()
        for _ in range(CALL_REPEATS):
            call()
        return (time.perf_counter() - start) / CALL_REPEATS * 1e3

    for size in batch_sizes:
        batch = synthetic_batch(rng, learner, obs_shape, obs_dtype, size)
        # The gradient as it comes back from the all-reduce: an array of its own.
        grad = learner.gradients(batch)[0].copy()
        act = batch.obs[:cfg.dqn.samplers]
        # The samplers infer once per round, a round of `samplers` steps pays for
        # samplers / train_period minibatches.
        times = [ms(partial(learner.predict, act)) * cfg.dqn.train_period / cfg.dqn.samplers,
                 ms(partial(next_values, batch.obs)), ms(partial(learner.gradients, batch)),
                 ms(partial(learner.apply, grad))]
        print(f"{size:>6d}{times[0]:>9.3f}{times[1]:>13.3f}{times[2]:>11.3f}{times[3]:>8.3f}"
              f"{sum(times):>9.2f}{sum(times) / size:>12.4f}", flush=True)
    return 0
