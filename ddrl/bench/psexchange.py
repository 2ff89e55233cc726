"""`ddrl bench ps`: time per parameter-server exchange, the network part of a synchronous
update in `sync.mode = "ps"`: every worker sends each server its slice of the gradient, each
server sums the slices of all workers and sends every worker the new slice. With `--hosts`,
the workers run one per simulated host and each server on a host of its own (as
`ddrl bench scaling` places them), over links limited to each of `--rates` in turn.

Raw mpi4py point-to-point, the message pattern of ddrl/distributed/ps_worker.py and
ps_server.py without their bookkeeping or the servers' Adam step: what the links cost, to set
beside the all-reduce of `ddrl bench allreduce` and the scaling model's server term."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

import numpy as np

from ddrl.bench.allreduce import buffers, relaunch, time_calls
from ddrl.distributed.ps import Layout
from ddrl.errors import DdrlError, EveryRankError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=2,
                   help="worker ranks when not already under a launcher (default 2)")
    p.add_argument("--servers", type=int, default=1, help="parameter-server ranks (the last)")
    p.add_argument("--sizes-mb", type=float, nargs="*", default=[1, 4, 16])
    p.add_argument("--repeat", type=int, default=10, help="timed exchanges per buffer")
    p.add_argument("--hosts", type=int, nargs="*", default=[],
                   help="worker host counts (root only): one rank per simulated host, each "
                        "server on a host of its own")
    p.add_argument("--rates", nargs="*", default=[],
                   help="link rates for --hosts, e.g. 100mbit 1gbit (default: unlimited)")


def exchange(comm, servers: int, n: int
             ) -> tuple[Callable[[np.ndarray], None], np.ndarray | None]:
    """(call, result): this rank's exchange for a gradient of n float32, a worker's or a
    server's, and the array a worker's call leaves the summed gradient in (None on servers)."""
    from mpi4py import MPI

    layout = Layout.of(servers, comm.size)
    workers, bounds = layout.workers, layout.bounds(n)
    if comm.rank < workers:
        out = np.empty(n, np.float32)

        def worker(grad: np.ndarray) -> None:
            reqs = []
            for s, (lo, hi) in enumerate(bounds):
                reqs.append(comm.Irecv(out[lo:hi], source=layout.server_rank(s)))
                reqs.append(comm.Isend(grad[lo:hi], dest=layout.server_rank(s)))
            MPI.Request.Waitall(reqs)
        return worker, out
    lo, hi = bounds[comm.rank - workers]
    size = hi - lo
    slices = np.empty((workers, size), np.float32)
    total = np.empty(size, np.float32)

    def server(_: np.ndarray) -> None:
        MPI.Request.Waitall([comm.Irecv(slices[w], source=w) for w in range(workers)])
        np.sum(slices, axis=0, out=total)
        MPI.Request.Waitall([comm.Isend(total, dest=w) for w in range(workers)])
    return server, None


def run(args: argparse.Namespace) -> int:
    from ddrl.distributed.world import discover, launched_by_mpi_or_slurm

    if args.servers < 1 or args.workers < 1 or args.repeat < 1 or \
            any(h < 1 for h in args.hosts):
        raise DdrlError("bench ps: need --servers, --workers, --repeat and --hosts >= 1")
    if not launched_by_mpi_or_slurm():
        bench = [sys.executable, "-m", "ddrl", "bench", "ps", "--servers", str(args.servers),
                 "--repeat", str(args.repeat), "--sizes-mb", *map(str, args.sizes_mb)]
        return relaunch(bench, args.workers + args.servers, args.hosts, args.rates,
                        extra_hosts=args.servers)
    from mpi4py import MPI

    world = discover(need_mpi=True)
    comm = world.comm
    if comm.size <= args.servers:
        raise EveryRankError(f"bench ps: {comm.size} ranks leave no worker beside {args.servers} "
                        "server(s)")
    workers = Layout.of(args.servers, comm.size).workers
    if world.is_root:
        print(f"parameter-server exchange across {workers} worker(s) and "
              f"{args.servers} server(s) on {world.hosts} host(s); median ms per exchange, "
              "slowest rank")
        print(f"{'buffer':>12s} {'MB':>8s} {'exchange':>10s}")
    for label, n in buffers(args.sizes_mb):
        call, result = exchange(comm, args.servers, n)
        ms = 1e3 * time_calls(comm, call, n, args.repeat, MPI.MAX)
        # Worker w sends w + 1 everywhere: every element must come back as the sum.
        call(np.full(n, comm.rank + 1, np.float32))
        wrong = result is not None and not np.all(result == workers * (workers + 1) / 2)
        if comm.allreduce(wrong, op=MPI.LOR):
            raise EveryRankError(f"bench ps: the exchange of {label} returned a wrong sum")
        if world.is_root:
            print(f"{label:>12s} {n * 4 / 2**20:8.2f} {ms:10.3f}", flush=True)
    return 0
