"""`ddrl bench scaling JOB.toml`: a model of synchronous training's update rate on p nodes
(all-reduce, or the job's parameter servers), calibrated and checked on simulated hosts
(ddrl/bench/simhosts.py), then extrapolated to 64.

An update on a node is its own work (simulate, predict, compute the gradient: t_node, which
does not change with p in data parallelism) followed by the sync, which does:
- all-reduce in the form of the algorithm MPI runs (`--allreduce`; the bench forces Open MPI
  to run that one, so the form and the runs agree). Rabenseifner's, Open MPI 4.1.4's own choice
  for gradients of a megabyte and more at 2-8 hosts (docs/scaling.md), reduce-scatters
  by recursive halving, then all-gathers by recursive doubling: 2 log2 p steps, each after a
  latency a, carrying 2 (p - 1) / p of the n-byte gradient at bandwidth B. The ring: 2 (p - 1)
  steps of n / p. Recursive doubling: log2 p exchanges of all n. For p not a power of 2 the
  ranks beyond the largest power of 2 first send their whole gradient to a partner and get the
  sum back at the end: one exchange of n in and one out.
- s parameter servers: each server's link carries every worker's 1/s slice in, then (once
  all are in and summed) the new slice out to every worker; each worker's link the whole
  gradient out, then back. One way at a time, at the link's own rate R (`ddrl bench ps`
  measured this within 4-13% at 2-8 workers, 1-2 servers, 100 Mbit/s and 1 Gbit/s):
  T = 2 a + 2 max(p / s, 1) n / R. (The all-reduce's fitted B is the wrong rate here: it
  carries both ways at once, so its payload rate is not the link's one-way rate.)
The update rate is 1 / (t_node + T) and the parallel efficiency t_node / (t_node + T); the
gradient cannot overlap the sync because the next batch's gradient needs the new weights.

Calibration: a and B from timed mpi4py all-reduces of several sizes between 2 simulated hosts
at the link rate, read through the chosen form at p = 2. Check: real `ddrl train` runs of the
job across 2..N simulated hosts (one rank each); each run's t_node (its wall time per update
less its sync time) and the model's T give a predicted update rate, set beside the measured one.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from ddrl.errors import DdrlError
from ddrl.output import say

CALIBRATION_MB = (0.25, 1.0, 2.0, 4.0)
# The paper's configuration (section 3.1): 332,295 float32 weights (FC 128), batch 32 per
# worker, 4 parameter servers; its Fig. 6 shows about 205 data points/s per worker at FC 128,
# so about 32 / 205 s of work per update on a 12-core node.
PAPER_WEIGHTS = 332_295
PAPER_T_NODE = 32 / 205
PAPER_SERVERS = 4
# Its reported scaling: 14.2 h to the Breakout target on 1 node, 21 min on 64.
PAPER_EFFICIENCY_64 = 14.2 * 60 / 21 / 64


# Open MPI's numbers for the algorithms (coll_tuned_allreduce_algorithm).
ALLREDUCE_ALGORITHMS = {"rabenseifner": 6, "ring": 4, "recursive-doubling": 3}


@dataclass(frozen=True)
class Link:
    latency: float    # a: seconds per message step
    bandwidth: float  # B: bytes per second

    def allreduce(self, p: int, nbytes: float, form: str = "rabenseifner") -> float:
        if p < 2:
            return 0.0
        if form == "ring":
            return 2 * (p - 1) * (self.latency + nbytes / p / self.bandwidth)
        power = p.bit_length() - 1
        core = 1 << power
        fold = 0.0 if p == core else 2 * (self.latency + nbytes / self.bandwidth)
        if form == "recursive-doubling":
            return fold + power * (self.latency + nbytes / self.bandwidth)
        return fold + 2 * power * self.latency + 2 * (core - 1) / core * nbytes / self.bandwidth

    def parameter_servers(self, p: int, nbytes: float, servers: int) -> float:
        """With `bandwidth` the link's one-way rate (not the all-reduce's fitted one)."""
        return 2 * self.latency + 2 * max(p / servers, 1.0) * nbytes / self.bandwidth


def fit_link(sizes: np.ndarray, seconds: np.ndarray, form: str = "rabenseifner") -> Link:
    """Least squares of the 2-node all-reduce time T = c + n / B; the form says how many
    latencies c holds (two in Rabenseifner's and the ring's steps, one in an exchange)."""
    slope, intercept = np.polyfit(sizes, seconds, 1)
    if slope <= 0:
        raise DdrlError("calibration: all-reduce time did not grow with size; raise --repeat")
    steps = Link(latency=1.0, bandwidth=np.inf).allreduce(2, 0.0, form)
    return Link(latency=max(intercept, 0.0) / steps, bandwidth=1.0 / slope)


def forced(form: str) -> list[str]:
    """mpirun options that make Open MPI's tuned collectives run that all-reduce."""
    return ["--mca", "coll_tuned_use_dynamic_rules", "1",
            "--mca", "coll_tuned_allreduce_algorithm", str(ALLREDUCE_ALGORITHMS[form])]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file (all-reduce sync)")
    p.add_argument("--hosts", type=int, nargs="*", default=[2, 3, 4],
                   help="simulated host counts to check the model on (default 2 3 4; "
                        "1: the node alone)")
    p.add_argument("--rate", default="100mbit", help="link rate of the simulated hosts")
    p.add_argument("--allreduce", choices=sorted(ALLREDUCE_ALGORITHMS), default="rabenseifner",
                   help="the all-reduce algorithm the runs are forced to and the model prices "
                        "(default rabenseifner: what Open MPI 4.1.4 runs for these gradients)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per run")
    p.add_argument("--repeat", type=int, default=10, help="timed all-reduces per size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the job (repeatable)")
    p.add_argument("--predict", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64],
                   help="node counts to predict")
    p.add_argument("--links", nargs="*", default=["1gbit", "10gbit", "56gbit"],
                   help="link rates for the paper configuration's prediction")


CALIBRATE = """
import sys, time, numpy as np
from mpi4py import MPI
from ddrl.output import say
comm, repeat = MPI.COMM_WORLD, int(sys.argv[1])
for mb in map(float, sys.argv[2:]):
    buf = np.ones(int(mb * 2**20) // 4, np.float32)
    comm.Allreduce(MPI.IN_PLACE, buf)
    times = []
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf)
        times.append(time.perf_counter() - t)
    worst = comm.allreduce(float(np.median(times)), op=MPI.MAX)
    if comm.rank == 0:
        say(f"calibration {buf.nbytes} {worst}")
"""


def calibrate(rate: str, repeat: int, form: str) -> Link:
    from ddrl.bench.simhosts import SimulatedHosts

    with SimulatedHosts(2, rate=rate) as net:
        cmd = net.mpirun([1, 1]) + forced(form) + [
            sys.executable, "-c", CALIBRATE, str(repeat), *map(str, CALIBRATION_MB)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [line.split()[1:] for line in proc.stdout.splitlines()
            if line.startswith("calibration ")]
    if proc.returncode != 0 or len(rows) != len(CALIBRATION_MB):
        raise DdrlError(f"calibration failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    sizes, seconds = np.array(rows, dtype=float).T
    return fit_link(sizes, seconds, form)


@dataclass(frozen=True)
class Measured:
    hosts: int
    updates_per_s: float
    t_node: float
    t_sync: float
    nbytes: int


def measure(job: str, overrides: list[str], hosts: int, servers: int, rate: str,
            seconds: float, nbytes: int, form: str) -> Measured:
    """`hosts` workers, one per simulated host, and the parameter servers (if any) each on a
    host of its own (they are the last ranks)."""
    from ddrl.bench.runs import timed_rows
    from ddrl.bench.simhosts import SimulatedHosts

    with SimulatedHosts(hosts + servers, rate=rate) as net:
        launch = net.mpirun([1] * (hosts + servers)) + forced(form)
        rows, warmup = timed_rows(launch, job, overrides, seconds, "train",
                                  f"the measured training on {hosts} hosts")
    if len(rows) < 3:
        raise DdrlError(f"fewer than 3 updates after {warmup:.0f} s of warm-up: raise --seconds")
    span = rows["wall_time"][-1] - rows["wall_time"][0]
    updates = rows["update"][-1] - rows["update"][0]
    t_sync = float(rows["t_sync"][1:].mean())
    return Measured(hosts, updates / span, span / updates - t_sync, t_sync, nbytes)


def gradient_bytes(cfg) -> int:
    from ddrl.algos import make_algorithm
    from ddrl.envs import env_spec
    from ddrl.models import build_model

    obs_shape, _, actions = env_spec(cfg)
    algo = make_algorithm(cfg)
    return 4 * build_model(cfg.model, obs_shape, actions, algo.head, algo.support).count_params()


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.simhosts import available, parse_rate
    from ddrl.placement import load_job

    reason = available()
    if reason:
        raise DdrlError(f"bench scaling: {reason}")
    parse_rate(args.rate)
    for rate in args.links:
        parse_rate(rate)
    if args.seconds <= 0 or any(h < 1 for h in args.hosts) or any(p < 1 for p in args.predict):
        raise DdrlError("bench scaling: need --seconds > 0, --hosts >= 1, --predict >= 1")
    cfg = load_job(args.job, args.set)
    servers = cfg.sync.ps if cfg.sync.mode == "ps" else 0
    nbytes = gradient_bytes(cfg)
    link = calibrate(args.rate, args.repeat, args.allreduce)
    say(f"[ddrl] links {args.rate}: fitted latency {link.latency * 1e3:.2f} ms per step, "
        f"bandwidth {link.bandwidth * 8 / 1e6:.1f} Mbit/s")
    one_way = Link(link.latency, parse_rate(args.rate) / 8)

    def sync_model(p: int) -> float:
        if servers:
            return one_way.parameter_servers(p, nbytes, servers)
        return link.allreduce(p, nbytes, args.allreduce)

    say("sync: " + (f"{servers} parameter server(s), each on a host of its own" if servers
                    else f"all-reduce ({args.allreduce})"))
    say(f"{'hosts':>5} {'t_node ms':>10} {'sync ms':>9} {'model ms':>9} {'updates/s':>10} "
        f"{'predicted':>10} {'error':>7}")
    measured = []
    for hosts in args.hosts:
        m = measure(args.job, args.set, hosts, servers, args.rate, args.seconds, nbytes,
                    args.allreduce)
        model = sync_model(hosts)
        predicted = 1.0 / (m.t_node + model)
        measured.append(m)
        say(f"{hosts:>5} {m.t_node * 1e3:>10.1f} {m.t_sync * 1e3:>9.1f} {model * 1e3:>9.1f} "
            f"{m.updates_per_s:>10.2f} {predicted:>10.2f} "
            f"{predicted / m.updates_per_s - 1:>+7.0%}")
    # The fewest simulated hosts share this machine's cores least: the closest to a node's own.
    t_node = min(m.t_node for m in measured)
    say(f"\nthis job on p nodes at {args.rate} (t_node {t_node * 1e3:.0f} ms, "
        f"gradient {measured[0].nbytes / 2**20:.2f} MB): predicted efficiency")
    say("  ".join(f"p={p}: {t_node / (t_node + sync_model(p)):.0%}" for p in args.predict))
    say(f"\nthe paper's configuration ({PAPER_WEIGHTS:,} weights, {PAPER_SERVERS} parameter "
        f"servers, t_node {PAPER_T_NODE * 1e3:.0f} ms), fitted latency, link rates "
        f"{', '.join(args.links)}: predicted efficiency")
    for rate in args.links:
        paper = Link(link.latency, parse_rate(rate) / 8)
        cells = []
        for p in args.predict:
            t_sync = paper.parameter_servers(p, 4 * PAPER_WEIGHTS, PAPER_SERVERS) if p > 1 else 0
            cells.append(f"p={p}: {PAPER_T_NODE / (PAPER_T_NODE + t_sync):.0%}")
        say(f"  {rate:>7}  " + "  ".join(cells))
    say(f"the paper reports {PAPER_EFFICIENCY_64:.0%} at 64 nodes (14.2 h on 1 node, 21 min on "
        "64, time to the Breakout target; its 64-node runs also used larger effective batches)")
    return 0
