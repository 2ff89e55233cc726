"""`ddrl bench project JOB --runs DIR ... --nodes 1 2 4 ... --cores-per-node 32 --link 10gbit`:
minutes to the target on a cluster, from measured inputs only.

Data-parallel training to a score costs, at R ranks (nodes x ranks per node):
- the frames F(R) and updates U(R) the job needs at the global batch of R ranks: measured by
  runs of the job at several rank counts, real or rehearsed (`sync.virtual_ranks`), and
  interpolated log-log between them; never past the largest measured count unless asked;
- each rank's simulation and training, F(R) / (R x frames/s of a rank), a rank being one core
  as in the recipes, at the runs' measured frames/s per core (a rehearsal's per-core rate is a
  real rank's: each virtual rank simulates and trains what a real one would);
- U(R) all-reduces across the nodes, each priced by the sync model that `ddrl bench scaling`
  checked on simulated hosts (Rabenseifner's form; docs/scaling.md), on a link carrying the
  all-reduce's payload at the measured share of its rate. The ranks within a node reduce
  through shared memory first: left out (microseconds for a megabyte against milliseconds
  between nodes).
An update's gradient cannot overlap its sync (the next batch needs the new weights), so the
two add up.
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

import numpy as np

from ddrl.errors import DdrlError
from ddrl.output import say

# The share of a link's rate that Open MPI's all-reduce carried as payload between simulated
# hosts (fitted, 100 Mbit/s links: 62 Mbit/s; docs/scaling.md).
LINK_SHARE = 0.62
# The paper's own result (Adamski et al. 2018): 12-core nodes, Breakout's target.
PAPER = "the paper: 14.2 h on 1 node, 21 min on 64 (12-core nodes, Breakout's target)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file the runs trained (its network sets the gradient)")
    p.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                   help="run directories of the job at several rank counts (real or rehearsed)")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--cores-per-node", type=int, default=32)
    p.add_argument("--link", nargs="+", default=["1gbit", "10gbit", "100gbit"],
                   help="link rates between nodes")
    p.add_argument("--latency-us", type=float, default=20.0,
                   help="latency per message step between nodes (TCP on Ethernet: tens of us)")
    p.add_argument("--link-share", type=float, default=LINK_SHARE,
                   help="share of the link rate the all-reduce carries as payload")
    p.add_argument("--target", type=float, help="score to reach (default: the runs' eval.target)")
    p.add_argument("--fps-per-core", type=float,
                   help="a rank's frames/s per core (default: the runs' own, measured)")
    p.add_argument("--run-cores", type=int,
                   help="cores the runs had, for logs that do not record it")
    p.add_argument("--extrapolate", action="store_true",
                   help="project past the largest measured rank count (log-log, from the last "
                        "two measured counts)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")


@dataclass
class Point:
    """What the runs at one rank count measured."""
    ranks: int
    runs: int
    frames: list[float]    # to the target, per run that reached it
    updates: list[float]
    fps_per_core: list[float]
    cpus: set[str]


def _rate(train) -> float:
    """A run's frames/s while it trained, first to last /train row (a PPO rollout's frames
    arrive in one step, so rows in between can show none)."""
    if len(train) < 2:
        return math.nan
    first, last = train.iloc[0], train.iloc[-1]
    seconds = float(last["wall_time"] - first["wall_time"])
    return float(last["frames"] - first["frames"]) / seconds if seconds > 0 else math.nan


def measure(paths: list[str], target: float | None, run_cores: int | None) -> list[Point]:
    from analysis.load import load_runs
    from analysis.scores import first_confirmed, resolve_target

    points: dict[int, Point] = {}
    for run in load_runs(paths):
        cores = run.attrs.get("cores", run_cores)
        if cores is None:
            raise DdrlError(f"{run.name}: its log does not say how many cores it had; "
                            "give --run-cores")
        ranks = run.workers
        point = points.setdefault(ranks, Point(ranks, 0, [], [], [], set()))
        point.runs += 1
        point.cpus.add(re.sub(r", \d+ cores.*", "", str(run.attrs.get("cpu", "CPU not recorded"))))
        point.fps_per_core.append(_rate(run["train"]) / int(cores))
        goal = resolve_target(run, target)
        if goal is None:
            raise DdrlError(f"{run.name}: no target (give --target)")
        # A crossing counts once confirmed where the run confirms (eval.confirm_episodes).
        hit = first_confirmed(run, goal)
        if hit is not None:
            point.frames.append(float(hit["frames"]))
            point.updates.append(float(hit["update"]))
    return sorted(points.values(), key=lambda p: p.ranks)


def interpolate(points: list[Point], ranks: int, field: str, extrapolate: bool
                ) -> tuple[float, str]:
    """The median of `field` at `ranks`, log-log between the measured counts around it, and
    how it was found."""
    known = [(p.ranks, float(np.median(getattr(p, field)))) for p in points if getattr(p, field)]
    if not known:
        return math.nan, "no run reached the target"
    xs, ys = np.log([k for k, _ in known]), np.log([v for _, v in known])
    x = math.log(ranks)
    if ranks in dict(known):
        return dict(known)[ranks], "measured"
    if x < xs[0]:
        # Fewer ranks: a smaller global batch, which needs no more frames than the smallest
        # measured one in data-parallel training (an upper bound).
        return math.exp(ys[0]), f"at most the {known[0][0]}-rank figure"
    if x > xs[-1]:
        if not extrapolate or len(known) < 2:
            return math.nan, f"beyond the largest measured batch ({known[-1][0]} ranks)"
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return math.exp(ys[-1] + slope * (x - xs[-1])), "EXTRAPOLATED"
    return math.exp(np.interp(x, xs, ys)), "interpolated"


def allreduce_seconds(nodes: int, nbytes: float, rate_bits: float, latency: float,
                      share: float) -> float:
    from ddrl.bench.scaling import Link

    return Link(latency, rate_bits * share / 8).allreduce(nodes, nbytes)


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.scaling import gradient_bytes
    from ddrl.bench.simhosts import parse_rate
    from ddrl.placement import load_job

    if args.cores_per_node < 1 or any(n < 1 for n in args.nodes) or \
            not 0 < args.link_share <= 1:
        raise DdrlError("bench project: need --nodes >= 1, --cores-per-node >= 1, "
                        "0 < --link-share <= 1")
    rates = {text: parse_rate(text) for text in args.link}
    cfg = load_job(args.job, args.set)
    nbytes = gradient_bytes(cfg)
    points = measure(args.runs, args.target, args.run_cores)
    # One rank per core, as the recipes bind them: a rank's batch is what one core simulates,
    # so the cores set the global batch (more cores per rank would need more simulators each).
    ranks_per_node = args.cores_per_node

    say(f"inputs ({args.job}):")
    for p in points:
        reached = f"{len(p.frames)}/{p.runs} reached"
        spread = (f"median {np.median(p.frames) / 1e6:.2f}M frames [{min(p.frames) / 1e6:.2f}-"
                  f"{max(p.frames) / 1e6:.2f}M], {np.median(p.updates):,.0f} updates"
                  if p.frames else "no frames to the target")
        say(f"  {p.ranks:>5} ranks: {reached}, {spread}; {np.median(p.fps_per_core):,.0f} "
            f"frames/s per core ({', '.join(sorted(p.cpus))})")
    # A bigger job keeps the global minibatch with smaller minibatches per rank, each with a
    # call's fixed cost: a rank's speed is the runs' at its own rank count, not the smallest's.
    fps_source = (f"{args.fps_per_core:,.0f} (--fps-per-core)" if args.fps_per_core else
                  "the runs' at its rank count, log-log between the measured counts")
    say(f"  a rank: one core, frames/s {fps_source}; {ranks_per_node} ranks per "
        f"{args.cores_per_node}-core node")
    say(f"  gradient: {nbytes / 2**20:.2f} MiB; all-reduce between nodes: Rabenseifner's form "
        f"(ddrl bench scaling), {args.latency_us:g} us per step, payload {args.link_share:.0%} "
        f"of the link rate")
    say(f"\n{'nodes':>5} {'ranks':>6} {'frames':>8} {'updates':>8} {'fps/core':>8} "
        + " ".join(f"{'min @ ' + t:>14}" for t in rates) + "  frames from")
    for nodes in args.nodes:
        ranks = nodes * ranks_per_node
        frames, how = interpolate(points, ranks, "frames", args.extrapolate)
        updates, _ = interpolate(points, ranks, "updates", args.extrapolate)
        fps_core = args.fps_per_core or interpolate(points, ranks, "fps_per_core", True)[0]
        compute = frames / (ranks * fps_core)
        cells = []
        for rate in rates.values():
            sync = updates * allreduce_seconds(nodes, nbytes, rate, args.latency_us * 1e-6,
                                               args.link_share)
            cells.append(f"{(compute + sync) / 60:>14.1f}" if math.isfinite(frames)
                         else f"{'-':>14}")
        fr = f"{frames / 1e6:>7.2f}M" if math.isfinite(frames) else f"{'-':>8}"
        up = f"{updates:>8,.0f}" if math.isfinite(updates) else f"{'-':>8}"
        fps = f"{fps_core:>8,.0f}" if math.isfinite(frames) else f"{'-':>8}"
        say(f"{nodes:>5} {ranks:>6} {fr} {up} {fps} " + " ".join(cells) + f"  {how}")
    say(f"\n{PAPER}")
    return 0
