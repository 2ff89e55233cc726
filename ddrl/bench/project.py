"""`ddrl bench project JOB --runs DIR ... --nodes 1 2 4 ... --cores-per-node 32 --link 10gbit`:
minutes to the target on a cluster, from measured inputs only: run directories, or the record
of their results (`--record CSV --rule TEXT`, `--speed-record CSV`: docs/results/).

Data-parallel training to a score costs, at R ranks (nodes x ranks per node):
- the frames F(R) and updates U(R) the job needs at the global batch of R ranks: measured by
  runs of the job at several rank counts, real or rehearsed (`sync.virtual_ranks`), and
  interpolated log-log between them; never past the largest measured count unless asked; a
  run that missed the target counts as reaching it past its budget, so a median resting on
  one is a lower bound, and so are the minutes projected from it;
- each rank's simulation and training, F(R) / (R x frames/s of a rank), a rank being one core
  as in the recipes, at a rank's frames/s per core measured by runs of real ranks with the
  same work per rank (its rollout, epochs and minibatches: `mpirun -n 2` of the job with the
  big job's `algo.minibatches` does each update what one of its ranks does). Never a
  rehearsal's: its k virtual ranks share one all-reduce and one optimizer step an update
  (and with `sync.virtual_fused`, one gradient call), which k real ranks each pay;
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
from pathlib import Path

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
    frames = p.add_mutually_exclusive_group(required=True)
    frames.add_argument("--runs", nargs="+", metavar="DIR",
                        help="run directories of the job at several rank counts (real or "
                             "rehearsed)")
    frames.add_argument("--record", metavar="CSV",
                        help="a record of such runs, one row each (the columns of "
                             "docs/results/frames-to-score.csv), in place of their directories")
    p.add_argument("--rule", action="append", default=[], metavar="TEXT",
                   help="with --record: the rows of this rule (repeatable; one rule a rank "
                        "count)")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--cores-per-node", type=int, default=32)
    p.add_argument("--link", nargs="+", default=["1gbit", "10gbit", "100gbit"],
                   help="link rates between nodes")
    p.add_argument("--latency-us", type=float, default=20.0,
                   help="latency per message step between nodes (TCP on Ethernet: tens of us)")
    p.add_argument("--link-share", type=float, default=LINK_SHARE,
                   help="share of the link rate the all-reduce carries as payload")
    p.add_argument("--target", type=float,
                   help="score to reach (default: the runs' eval.target; a --record's rows "
                        "are to its own)")
    p.add_argument("--fps-per-core", type=float,
                   help="a rank's frames/s per core (default: measured by real ranks alike)")
    p.add_argument("--speed-runs", nargs="+", default=[], metavar="DIR",
                   help="runs of real ranks that give only a rank's frames/s per core, for the "
                        "measured rank counts whose ranks have the same rollout, epochs and "
                        "minibatches (short runs; their frames are not used)")
    p.add_argument("--speed-record", metavar="CSV",
                   help="a record of such runs' rates, one row each (the columns of "
                        "docs/results/rank-speed.csv)")
    p.add_argument("--run-cores", type=int,
                   help="cores the runs had, for logs that do not record it")
    p.add_argument("--extrapolate", action="store_true",
                   help="project past the largest measured rank count (log-log, from the last "
                        "two measured counts)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")


@dataclass
class Point:
    """What the runs at one rank count measured: per run, the frames and updates to the target,
    or those it ran where it did not reach it."""
    ranks: int
    frames: list[float]
    updates: list[float]
    reached: list[bool]
    fps_per_core: list[float]
    sources: set[str]
    work: tuple | None = None

    def median(self, field: str) -> tuple[float, bool]:
        """(median of `field`, exact): a run that missed the target counts as reaching it past
        its budget, so where such a run can sit at or below the middle, the median is only a
        lower bound (`median_bound`)."""
        import pandas as pd

        from analysis.scores import median_bound

        return median_bound(pd.Series(getattr(self, field)), pd.Series(self.reached))

    def hits(self) -> list[float]:
        """The frames of the runs that reached the target."""
        return [f for f, r in zip(self.frames, self.reached) if r]

    def slowest(self) -> tuple[float, bool]:
        """The most frames a seed took: a lower bound where a seed missed."""
        return max(self.frames), all(self.reached)


def _rate(train) -> float:
    """A run's frames/s while it trained, from the /train row that first counted its first
    frames to the row that first counted its last: a PPO rollout's frames arrive in one step
    and the rows after repeat the count, so a span to the last row would charge the time of a
    rollout not yet counted (in a run of a few rollouts, a third of its rate)."""
    arrivals = train.drop_duplicates("frames")
    if len(arrivals) < 2:
        return math.nan
    first, last = arrivals.iloc[0], arrivals.iloc[-1]
    seconds = float(last["wall_time"] - first["wall_time"])
    return float(last["frames"] - first["frames"]) / seconds if seconds > 0 else math.nan


# What a rank computes per frame: its rollout (simulators x steps) and the updates it makes of
# it. Runs alike in these run a rank at the same frames/s, whatever their rank count.
WORK = ("rollout", "epochs", "minibatches")


def _work(run) -> tuple:
    return (run.setting("acting.n_sim") * run.setting("acting.t_max"),
            run.setting("algo.epochs"), run.setting("algo.minibatches"))


def _describe(work: tuple) -> str:
    return ", ".join(f"{key} {value}" for key, value in zip(WORK, work))


def _fps_per_core(run, run_cores: int | None) -> float | None:
    """A rank's frames/s per core as the run measured it; None for a rehearsal, whose virtual
    ranks share an update's all-reduce and optimizer step (and, fused, its gradient call): it
    runs faster than its ranks would (the Pong rule's 32 and 64 ranks, 16 and 32 a process
    without fusing: 1.5x and 1.4x a real rank; docs/scaling.md)."""
    cores = run.attrs.get("cores", run_cores)
    if cores is None:
        raise DdrlError(f"{run.name}: its log does not say how many cores it had; "
                        "give --run-cores")
    if run.setting("sync.virtual_ranks", 1) > 1:
        return None
    return _rate(run["train"]) / int(cores)


def measure(paths: list[str], target: float | None, run_cores: int | None) -> list[Point]:
    from analysis.load import load_runs
    from analysis.scores import first_confirmed, resolve_target

    points: dict[int, Point] = {}
    for run in load_runs(paths):
        ranks = run.workers
        work = _work(run)
        point = points.setdefault(ranks, Point(ranks, [], [], [], [], set(), work))
        if work != point.work:
            raise DdrlError(f"{run.name}: its ranks' {_describe(work)} differ from the other "
                            f"{ranks}-rank runs' ({_describe(point.work)}): one setting a rank count")
        point.sources.add(re.sub(r", \d+ cores.*", "", str(run.attrs.get("cpu", "CPU not recorded"))))
        train = run["train"]
        fps = _fps_per_core(run, run_cores)
        if fps is not None:
            point.fps_per_core.append(fps)
        goal = resolve_target(run, target)
        if goal is None:
            raise DdrlError(f"{run.name}: no target (give --target)")
        # A crossing counts once confirmed where the run confirms (eval.confirm_episodes).
        hit = first_confirmed(run, goal)
        end = hit if hit is not None else (train.iloc[-1] if len(train) else None)
        if end is None:
            raise DdrlError(f"{run.name}: its log has no training rows")
        point.frames.append(float(end["frames"]))
        point.updates.append(float(end["update"]))
        point.reached.append(hit is not None)
    return sorted(points.values(), key=lambda p: p.ranks)


def measure_speed(paths: list[str], run_cores: int | None) -> dict[tuple, list[float]]:
    """A rank's work (`WORK`) -> frames/s per core of runs given for their speed only."""
    from analysis.load import load_runs

    speeds: dict[tuple, list[float]] = {}
    for run in load_runs(paths):
        fps = _fps_per_core(run, run_cores)
        if fps is None:
            raise DdrlError(f"{run.name}: a rehearsal (sync.virtual_ranks), whose ranks share "
                            "an update's all-reduce and optimizer step: its frames/s is not a "
                            "rank's; run real ranks with the same settings")
        speeds.setdefault(_work(run), []).append(fps)
    return speeds


def _read_record(path: str, columns: set[str]):
    from analysis.batch_scaling import read_record

    try:
        return read_record(path, columns)
    except ValueError as e:
        raise DdrlError(str(e)) from None


def measure_record(path: str, rules: list[str]) -> list[Point]:
    """Points from a record of runs (analysis.batch_scaling's columns), the rows of `rules`:
    the frames each run took to the record's target, or ran where it missed it."""
    from analysis.batch_scaling import RECORD_COLUMNS, with_derived

    df = with_derived(_read_record(path, RECORD_COLUMNS))
    if not rules:
        raise DdrlError(f"--record {path}: give the rows to project from with --rule "
                        f"(its rules: {'; '.join(dict.fromkeys(df['rule']))})")
    unknown = [r for r in rules if r not in set(df["rule"])]
    if unknown:
        raise DdrlError(f"--record {path}: no rows of the rule {unknown[0]!r}")
    points: dict[int, Point] = {}
    for row in df[df["rule"].isin(rules)].itertuples():
        work = (int(row.rollout), int(row.epochs), int(row.minibatches))
        point = points.setdefault(int(row.ranks),
                                  Point(int(row.ranks), [], [], [], [], set(), work))
        if work != point.work:
            raise DdrlError(f"--record {path}: its {row.ranks}-rank rows of the given rules "
                            f"differ in a rank's work ({_describe(work)} against "
                            f"{_describe(point.work)}): one rule a rank count")
        point.sources.add(f"{Path(path).name}: {row.rule}, {row.criterion}")
        point.frames.append(float(row.frames))
        point.updates.append(float(row.frames) / float(row.frames_per_update))
        point.reached.append(bool(row.reached))
    return sorted(points.values(), key=lambda p: p.ranks)


# A record of a rank's measured speed: one row a run of real ranks (docs/results/rank-speed.csv).
SPEED_COLUMNS = {"rollout", "epochs", "minibatches", "fps_per_core", "cpu"}


def measure_speed_record(path: str) -> tuple[dict[tuple, list[float]], dict[tuple, str]]:
    """A rank's work -> its frames/s per core as recorded, and -> where they came from."""
    df = _read_record(path, SPEED_COLUMNS)
    speeds: dict[tuple, list[float]] = {}
    cpus: dict[tuple, list[str]] = {}
    for row in df.itertuples():
        work = (int(row.rollout), int(row.epochs), int(row.minibatches))
        speeds.setdefault(work, []).append(float(row.fps_per_core))
        cpus.setdefault(work, []).append(str(row.cpu))
    return speeds, {w: f"{Path(path).name}, {', '.join(dict.fromkeys(c))}"
                    for w, c in cpus.items()}


def interpolate(known: list[tuple[int, float, bool]], ranks: int, extrapolate: bool
                ) -> tuple[float, str, bool]:
    """A figure at `ranks` from (ranks, figure, exact) measured at several counts, log-log
    between the counts around it; how it was found, and whether it is exact (False: a lower
    bound, since a run it rests on missed the target)."""
    xs = np.log([r for r, _, _ in known])
    ys = np.log([v for _, v, _ in known])
    x = math.log(ranks)
    for r, value, exact in known:
        if r == ranks:
            return value, "measured" if exact else "measured, a lower bound", exact
    if x < xs[0]:
        # Fewer ranks: a smaller global batch, which needs no more frames than the smallest
        # measured one in data-parallel training (an upper bound), unless that is unknown.
        if not known[0][2]:
            return math.nan, f"the {known[0][0]}-rank median is only a lower bound", False
        return known[0][1], f"at most the {known[0][0]}-rank figure", True
    if x > xs[-1]:
        if not extrapolate or len(known) < 2:
            return math.nan, f"beyond the largest measured batch ({known[-1][0]} ranks)", False
        if not (known[-1][2] and known[-2][2]):
            return math.nan, "no extrapolation from a lower bound", False
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return math.exp(ys[-1] + slope * (x - xs[-1])), "EXTRAPOLATED", True
    # The interpolation rises with either end's value: a lower bound at either end bounds it.
    i = int(np.searchsorted(xs, x))
    exact = known[i - 1][2] and known[i][2]
    return (math.exp(np.interp(x, xs, ys)),
            "interpolated" if exact else "interpolated, a lower bound", exact)


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
    if args.rule and not args.record:
        raise DdrlError("bench project: --rule picks rows of a --record")
    points = (measure_record(args.record, args.rule) if args.record
              else measure(args.runs, args.target, args.run_cores))
    speeds = measure_speed(args.speed_runs, args.run_cores)
    speed_from = dict.fromkeys(speeds, "run(s) of real ranks")
    if args.speed_record:
        recorded, recorded_from = measure_speed_record(args.speed_record)
        for work, fps in recorded.items():
            speeds.setdefault(work, []).extend(fps)
            speed_from[work] = "; ".join(filter(None, (speed_from.get(work), recorded_from[work])))
    for p in points:
        speeds.setdefault(p.work, []).extend(p.fps_per_core)
        if p.fps_per_core:
            speed_from.setdefault(p.work, "run(s) of real ranks")
    fps_known = [(p.ranks, float(np.median(speeds[p.work])), True) for p in points
                 if speeds.get(p.work)]
    # One rank per core, as the recipes bind them: a rank's batch is what one core simulates,
    # so the cores set the global batch (more cores per rank would need more simulators each).
    ranks_per_node = args.cores_per_node

    say(f"inputs ({args.job}):")
    for p in points:
        median, exact = p.median("frames")
        hits = p.hits()
        spread = f" [{min(hits) / 1e6:.2f}-{max(hits) / 1e6:.2f}M reached]" if hits else ""
        measured = speeds.get(p.work, [])
        say(f"  {p.ranks:>5} ranks: {sum(p.reached)}/{len(p.reached)} reached, median "
            f"{'' if exact else '> '}{median / 1e6:.2f}M frames{spread}, "
            f"{'' if exact else '> '}{p.median('updates')[0]:,.0f} updates "
            f"({', '.join(sorted(p.sources))}); a rank ({_describe(p.work)}): "
            + (f"{np.median(measured):,.0f} frames/s per core, median of {len(measured)} "
               f"({speed_from[p.work]})" if measured
               else "frames/s not measured (no run of real ranks alike)"))
    for work in speeds:
        if not any(p.work == work for p in points):
            say(f"  a rank's speed with {_describe(work)} ({speed_from[work]}): alike no "
                "measured rank count, not used")
    if not (fps_known or args.fps_per_core):
        raise DdrlError("no run gives a rank's frames/s (a rehearsal's is not a rank's): give "
                        "--speed-runs (real ranks with a measured rank count's rollout, epochs "
                        "and minibatches), --speed-record or --fps-per-core")
    # A bigger job keeps the global minibatch with smaller minibatches per rank, each with a
    # call's fixed cost: a rank's speed is that of its own rank count's work, not the smallest's.
    fps_source = (f"{args.fps_per_core:,.0f} (--fps-per-core)" if args.fps_per_core else
                  "a rank's at the measured counts, log-log between them")
    say(f"  a rank: one core, frames/s {fps_source}; {ranks_per_node} ranks per "
        f"{args.cores_per_node}-core node")
    say(f"  gradient: {nbytes / 2**20:.2f} MiB; all-reduce between nodes: Rabenseifner's form "
        f"(ddrl bench scaling), {args.latency_us:g} us per step, payload {args.link_share:.1%} "
        f"of the link rate")
    fastest_link = max(rates, key=rates.get)
    say(f"\n{'nodes':>5} {'ranks':>6} {'frames':>8} {'updates':>8} {'fps/core':>8} "
        + " ".join(f"{'min @ ' + t:>14}" for t in rates)
        + f" {'seeds @ ' + fastest_link:>18}  frames from")
    frames_known = [(p.ranks, *p.median("frames")) for p in points]
    fastest_known = [(p.ranks, min(p.hits()), True) for p in points if p.hits()]
    slowest_known = [(p.ranks, *p.slowest()) for p in points]
    updates_known = [(p.ranks, *p.median("updates")) for p in points]
    for nodes in args.nodes:
        ranks = nodes * ranks_per_node
        frames, how, exact = interpolate(frames_known, ranks, args.extrapolate)
        updates, _, _ = interpolate(updates_known, ranks, args.extrapolate)
        fps_core = args.fps_per_core or interpolate(fps_known, ranks, True)[0]
        # Seconds a frame costs on each link: its share of a rank-second, and of an update's
        # all-reduce (a rank count's frames per update are its global batch's).
        per_frame = {text: 1 / (ranks * fps_core) + updates / frames * allreduce_seconds(
            nodes, nbytes, rate, args.latency_us * 1e-6, args.link_share)
            for text, rate in rates.items()}
        # Minutes from lower bounds on the frames and updates are lower bounds too.
        bound = "" if exact else "> "
        cells = [f"{bound + format(frames * per_frame[t] / 60, '.2f'):>14}"
                 if math.isfinite(frames) else f"{'-':>14}" for t in rates]
        # The seeds' spread, carried to the minutes the same way, on the fastest link.
        low = interpolate(fastest_known, ranks, args.extrapolate)[0] if fastest_known \
            else math.nan
        high, _, high_exact = interpolate(slowest_known, ranks, args.extrapolate)
        cells.append(f"{low * per_frame[fastest_link] / 60:.2f}-{'' if high_exact else '>'}"
                     f"{high * per_frame[fastest_link] / 60:.2f}".rjust(18)
                     if math.isfinite(frames) and math.isfinite(low) and math.isfinite(high)
                     else f"{'-':>18}")
        fr = (f"{bound + format(frames / 1e6, '.2f') + 'M':>8}" if math.isfinite(frames)
              else f"{'-':>8}")
        up = f"{bound + format(updates, ',.0f'):>8}" if math.isfinite(updates) else f"{'-':>8}"
        fps = f"{fps_core:>8,.0f}" if math.isfinite(frames) else f"{'-':>8}"
        say(f"{nodes:>5} {ranks:>6} {fr} {up} {fps} " + " ".join(cells) + f"  {how}")
    say(f"\n{PAPER}")
    return 0
