"""`ddrl bench allreduce`: time per all-reduce of each sync backend next to a raw mpi4py
Allreduce, for buffers the size of the models' gradients and for 1 to 64 MB. With `--hosts`,
the ranks run one per simulated host (network namespaces, ddrl/bench/simhosts.py), over TCP
links limited to each of `--rates` in turn: what the sync costs between machines."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from ddrl.output import say

MODEL_BUFFERS = (("ddrl fc256", "ddrl", 256), ("ddrl fc128", "ddrl", 128),
                 ("nature", "nature", 512), ("a3c", "a3c", 256))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=2,
                   help="ranks to start with mpirun when not already under a launcher")
    p.add_argument("--sizes-mb", type=float, nargs="*", default=[1, 4, 16, 64])
    p.add_argument("--repeat", type=int, default=20, help="timed all-reduces per buffer")
    p.add_argument("--backends", nargs="*", default=["mpi", "horovod"])
    p.add_argument("--hosts", type=int, nargs="*", default=[],
                   help="simulated host counts (root only): one rank per host, over TCP")
    p.add_argument("--rates", nargs="*", default=[],
                   help="link rates for --hosts, e.g. 100mbit 1gbit (default: unlimited)")


def _relaunch(args: argparse.Namespace) -> int:
    bench = [sys.executable, "-m", "ddrl", "bench", "allreduce", "--repeat", str(args.repeat),
             "--sizes-mb", *map(str, args.sizes_mb), "--backends", *args.backends]
    return relaunch(bench, args.ranks, args.hosts, args.rates)


def relaunch(bench: list[str], ranks: int, hosts: list[int], rates: list[str],
             extra_hosts: int = 0) -> int:
    """Run `bench` under mpirun: `ranks` ranks on this machine, or one rank per simulated
    host for each host count in `hosts` (plus `extra_hosts` more, e.g. parameter servers)
    at each link rate."""
    from ddrl.distributed.launch import mpirun_command

    if hosts:
        return _across_hosts(bench, hosts, rates, extra_hosts)
    # Unbound: the timings are of the collective, not of ranks pinned to cores they share.
    cmd = mpirun_command(ranks, bind=False) + bench
    return os.spawnv(os.P_WAIT, cmd[0], cmd)


def _across_hosts(bench: list[str], host_counts: list[int], rates: list[str],
                  extra_hosts: int) -> int:
    from ddrl.bench.simhosts import SimulatedHosts, parse_rate

    rates = rates or [None]
    for rate in rates:
        if rate is not None:
            parse_rate(rate)
    for hosts in host_counts:
        for rate in rates:
            with SimulatedHosts(hosts + extra_hosts, rate=rate) as net:
                say(f"== {hosts + extra_hosts} simulated host(s), one rank each, links "
                    f"{rate or 'unlimited'}")
                cmd = net.mpirun([1] * (hosts + extra_hosts)) + bench
                code = subprocess.run(cmd).returncode
            if code:
                return code
    return 0


def buffers(sizes_mb: list[float]) -> list[tuple[str, int]]:
    """(label, float32 count): the models' gradients, then `sizes_mb`."""
    from ddrl.config import ModelConfig
    from ddrl.models import build_model

    out = [(name, build_model(ModelConfig(arch=arch, fc=fc), (4, 84, 84), 6).count_params())
           for name, arch, fc in MODEL_BUFFERS]
    return out + [(f"{mb:g} MB", int(mb * 2**20) // 4) for mb in sizes_mb]


def time_calls(comm, reduce, n: int, repeat: int, op_max) -> float:
    """Median seconds per call, the slowest rank's (all-reduce is as fast as its last rank)."""
    buf = np.ones(n, np.float32)
    for _ in range(3):
        reduce(buf)
    times = []
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        reduce(buf)
        times.append(time.perf_counter() - start)
    return comm.allreduce(statistics.median(times), op=op_max)


def run(args: argparse.Namespace) -> int:
    from ddrl.distributed.world import discover, launched_by_mpi_or_slurm

    if not launched_by_mpi_or_slurm():
        return _relaunch(args)
    from mpi4py import MPI

    from ddrl.distributed.allreduce import HorovodSync, MpiAllreduceSync

    world = discover(need_mpi=True)
    comm = world.comm
    raw_out = {}

    def raw(buf: np.ndarray) -> None:
        out = raw_out.setdefault(buf.size, np.empty_like(buf))
        comm.Allreduce(buf, out, op=MPI.SUM)

    reducers = {"raw mpi4py": raw}
    backends = {"mpi": MpiAllreduceSync, "horovod": HorovodSync}
    for name in args.backends:
        reducers[f"{name} backend"] = backends[name](world, timeout=600.0).allreduce_sum
    if world.is_root:
        print(f"all-reduce (sum, float32) across {world.size} ranks on {world.hosts} host(s); "
              f"median ms per call, slowest rank")
        header = f"{'buffer':>12s} {'MB':>8s} " + " ".join(f"{k:>16s}" for k in reducers)
        print(header + f" {'mpi/raw':>8s}")
    for label, n in buffers(args.sizes_mb):
        ms = {k: 1e3 * time_calls(comm, fn, n, args.repeat, MPI.MAX) for k, fn in reducers.items()}
        if world.is_root:
            ratio = ms["mpi backend"] / ms["raw mpi4py"] if "mpi backend" in ms else float("nan")
            row = " ".join(f"{v:16.3f}" for v in ms.values())
            print(f"{label:>12s} {n * 4 / 2**20:8.2f} {row} {ratio:8.2f}", flush=True)
    return 0
