"""`ddrl bench stragglers JOB.toml`: what one slow worker costs synchronous training, with the
paper's remedy (aggregate the first k of n gradients, section 2.3) against waiting for all n.

Four real `ddrl train` runs in parameter-server mode under mpirun, each for the same time:
k of n and n of n, each with every worker at speed and with the last worker slowed
(debug.slow_ranks). The update rate is read from server 0's rows in the log, after a warm-up.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ddrl.errors import DdrlError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file")
    p.add_argument("--workers", type=int, default=4, help="worker ranks (default 4)")
    p.add_argument("--servers", type=int, default=1, help="parameter-server ranks (default 1)")
    p.add_argument("--slow-factor", type=float, default=3.0,
                   help="how many times slower the last worker computes (default 3)")
    p.add_argument("--aggregate", type=float, default=0.75,
                   help="sync.aggregate of the k-of-n runs, a fraction or a count (default 0.75)")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="measured seconds of each of the four runs (default 30)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run (repeatable)")


@dataclass
class Rates:
    """Per second of the measured window: updates and gradients applied and dropped."""
    updates: float
    applied: float
    dropped: float


def measure(job: str, overrides: list[str], workers: int, servers: int, seconds: float) -> Rates:
    from ddrl.bench.runs import timed_rows
    from ddrl.distributed.launch import mpirun_command

    sets = ["sync.mode=ps", f"sync.ps={servers}", *overrides]
    rows, warmup = timed_rows(mpirun_command(workers + servers), job, sets, seconds, "servers",
                              "the measured training")
    rows = rows[rows["server"] == 0]
    if len(rows) < 2:
        raise DdrlError(f"fewer than 2 updates after {warmup:.0f} s of warm-up: raise --seconds")
    first, last = rows[0], rows[-1]
    span = last["wall_time"] - first["wall_time"]
    return Rates(*((last[k] - first[k]) / span for k in ("version", "applied", "dropped")))


def run(args: argparse.Namespace) -> int:
    from ddrl.distributed.ps import quorum
    from ddrl.placement import load_job

    w, slow = args.workers, args.workers - 1
    if w < 2 or args.servers < 1 or args.seconds <= 0 or args.slow_factor <= 1:
        raise DdrlError("need --workers >= 2, --servers >= 1, --seconds > 0, --slow-factor > 1")
    cfg = load_job(args.job, args.set)
    k = quorum(args.aggregate, w)
    straggler = [f"debug.slow_ranks=[{slow}]", f"debug.slow_factor={args.slow_factor}"]
    print(f"[ddrl] stragglers: {cfg.env.id}, {w} workers + {args.servers} server(s), worker "
          f"rank {slow} slowed {args.slow_factor:g}x; four runs of {args.seconds:g} s measured "
          "each", flush=True)
    table = []
    for aggregate, label in ((args.aggregate, f"k-of-n {k}/{w}"), (1.0, f"full sync {w}/{w}")):
        rates = [measure(args.job, [*args.set, f"sync.aggregate={aggregate}", *extra], w,
                         args.servers, args.seconds) for extra in ([], straggler)]
        table.append((label, *rates))
        print(f"[ddrl]   {label}: {rates[0].updates:.1f} updates/s at speed, "
              f"{rates[1].updates:.1f} with the straggler", flush=True)
    print(f"{'aggregate':<16}{'updates/s':>12}{'updates/s':>12}{'slowed /':>10}"
          f"{'dropped':>10}\n{'':<16}{'at speed':>12}{'slowed':>12}{'at speed':>10}"
          f"{'(slowed)':>10}")
    for label, fast, slowed in table:
        dropped = slowed.dropped / max(slowed.applied + slowed.dropped, 1e-9)
        print(f"{label:<16}{fast.updates:>12.1f}{slowed.updates:>12.1f}"
              f"{slowed.updates / fast.updates:>10.2f}{dropped:>10.0%}")
    print(f"with the straggler, k-of-n makes {table[0][2].updates / table[1][2].updates:.2f}x "
          "the updates per second of full sync")
    return 0
