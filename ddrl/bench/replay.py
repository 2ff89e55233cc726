"""`ddrl bench replay`: what prioritized replay costs against the uniform memory.

Both memories are filled with the same stream of Atari-sized frames (random pixels, a game
ending now and then), then each draws minibatches of each size in alternating rounds, the
prioritized one also writing back a priority per transition, as the dqn node does after each
gradient. Printed: microseconds per minibatch and per transition, the cost of storing a step,
and the memory each holds, measured (resident pages after the fill) and as allocated.

With --r2d2 a third memory, R2D2's prioritized sequences at its published settings (a 512-unit
LSTM's state stored every 40 steps, sequences of 40 burn-in + 80 + 5 steps, alpha 0.9, 64
sequences per minibatch), is filled and drawn from the same way.
"""
from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from ddrl.acting.prioritized import Priorities, PrioritizedReplay
from ddrl.acting.replay import ReplayMemory
from ddrl.acting.sequences import PrioritizedSequences

# R2D2's (Kapturowski et al. 2019, Table 2): LSTM units, sequence period, burn-in + learned
# + n steps, priority exponent, importance-weight exponent, sequences per minibatch.
R2D2 = {"units": 512, "period": 40, "span": 40 + 80 + 5, "alpha": 0.9, "beta": 0.6, "batch": 64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--frames", type=int, default=500_000,
                   help="capacity of each memory in frames (default 500,000)")
    p.add_argument("--streams", type=int, default=8, help="simulators writing (default 8)")
    p.add_argument("--size", type=int, default=84, help="frame side in pixels (default 84)")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 512, 2048],
                   help="minibatch sizes (default 32 512 2048)")
    p.add_argument("--n-step", type=int, default=3, help="steps of the return (default 3)")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds per minibatch size (default 5)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="seconds per memory per round (default 1)")
    p.add_argument("--r2d2", action="store_true",
                   help="also R2D2's memory of prioritized sequences (its published settings)")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _fill(memory: ReplayMemory, streams: int, size: int, seed: int) -> float:
    """Seconds per step stored."""
    rng = np.random.default_rng(seed)
    ids = np.arange(streams)
    memory.begin(ids, rng.integers(0, 256, (streams, 4, size, size), np.uint8))
    steps = memory.slots + 16
    frames = rng.integers(0, 256, (64, streams, 4, size, size), np.uint8)
    states = ((rng.normal(size=(streams, 2, R2D2["units"])).astype(np.float32),)
              if isinstance(memory, PrioritizedSequences) else ())
    t0 = time.perf_counter()
    for t in range(steps):
        memory.add(ids, rng.integers(0, 6, streams), rng.normal(size=streams).astype(np.float32),
                   rng.random(streams) < 1 / 800, np.full(streams, t), frames[t % 64], *states)
    return (time.perf_counter() - t0) / (steps * streams)


def _draw(memory: ReplayMemory, batch: int, n: int, rng: np.random.Generator,
          seconds: float) -> tuple[int, float]:
    """Minibatches drawn (and, prioritized, given new priorities) in about `seconds`."""
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sample = memory.sample(batch, n, rng)
        if isinstance(memory, Priorities):
            memory.update(sample.index, rng.random(batch) * 2)
        count += 1
    return count, time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from ddrl.commands.info import cpu_summary

    print(f"ddrl bench replay: {args.frames:,} frames of {args.size}x{args.size} in "
          f"{args.streams} streams, {args.n_step}-step transitions; {cpu_summary()}", flush=True)
    shape = (args.frames, args.streams, (4, args.size, args.size), np.dtype(np.uint8), True)
    memories: dict[str, ReplayMemory] = {}
    kinds = {"uniform": lambda: ReplayMemory(*shape),
             "prioritized": lambda: PrioritizedReplay(*shape, args.n_step, 0.5, 0.4)}
    if args.r2d2:
        kinds["r2d2"] = lambda: PrioritizedSequences(*shape, R2D2["units"], R2D2["period"],
                                                     R2D2["span"], R2D2["alpha"], R2D2["beta"])
    for name, make in kinds.items():
        before = _rss_mib()
        memory = make()
        per_step = _fill(memory, args.streams, args.size, seed=0)
        print(f"  {name:11s}: store {per_step * 1e6:6.1f} us per step; "
              f"{(_rss_mib() - before) / 1024:.2f} GiB resident, "
              f"{memory.nbytes / 2**30:.2f} GiB allocated", flush=True)
        memories[name] = memory
    rng = np.random.default_rng(1)
    if args.r2d2:
        r2d2 = memories.pop("r2d2")
        count, spent = _draw(r2d2, R2D2["batch"], args.n_step, rng, args.seconds * args.rounds)
        print(f"  r2d2       : {R2D2['batch']} sequences of {R2D2['span']} steps "
              f"{spent / count * 1e3:8.1f} ms with their priority update "
              f"({spent / count / (R2D2['batch'] * R2D2['span']) * 1e6:5.2f} us per step)",
              flush=True)
        del r2d2
    for batch in args.batches:
        totals = {name: [0, 0.0] for name in memories}
        for _ in range(args.rounds):
            for name, memory in memories.items():
                count, spent = _draw(memory, batch, args.n_step, rng, args.seconds)
                totals[name][0] += count
                totals[name][1] += spent
        us = {name: spent / count * 1e6 for name, (count, spent) in totals.items()}
        print(f"  batch {batch:5d}: uniform {us['uniform']:8.0f} us "
              f"({us['uniform'] / batch:5.2f} per transition), prioritized "
              f"{us['prioritized']:8.0f} us ({us['prioritized'] / batch:5.2f}) with its "
              f"priority update: {us['prioritized'] / us['uniform']:.2f}x", flush=True)
    return 0
