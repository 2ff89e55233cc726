"""Parameter-server mode (`sync.mode = "ps"`): rank layout, message formats, shared helpers.

Ranks 0..W-1 are workers and the last `sync.ps` ranks are servers, so rank 0 stays the
chief that logs, evaluates and checkpoints whatever the mode. Server s holds one contiguous
slice of the flat parameter vector and that slice's Adam state; workers send gradient slices
and get weight slices back, point to point.

Server 0 is also the sequencer: it alone decides which gradients make an update (k-of-n) or
the order they apply in (async), and tells the other servers in one ordered control stream.
So every slice goes through the same updates, a gradient is applied or dropped as a whole,
and all slices a worker gets back belong to the same version of the weights.

Messages (layouts below, by field name): a worker sends each server a float64 META (kind,
version, gradients sent, wants Adam state, then the side channel for server 0) and, for a
gradient, its float32 slice as DATA. A server answers with a float64 REPLY (its STATUS, then
for the asking worker the interval figures since that worker's previous reply) and its weight
slice, plus the Adam moments when the worker asked for state. Server 0 tells the others its
decisions as int64 CONTROL messages.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ddrl.config import Config
from ddrl.distributed.schema import Schema
from ddrl.distributed.world import World
from ddrl.errors import DdrlError

# Message tags. Each (source, tag) pair is FIFO in MPI, so one tag per kind of payload keeps
# a worker's META and DATA, and a server's REPLY and slices, matched in order.
META, DATA, REPLY, WEIGHTS, MOMENT, VELOCITY, CONTROL = range(11, 18)
# Worker -> server META kinds.
GRAD, STATE, BYE = range(3)
# Server 0 -> other servers, in order: which pending worker messages to resolve how.
APPLY, DROP, SNAPSHOT, FINISH = range(4)
# A server's cumulative figures, first in every reply; the `servers` log table's columns.
STATUS = Schema("version", "iterations", "lost", "received", "applied", "dropped", "sent",
                "staleness_sum", "bytes_in", "bytes_out", "t_busy", "t_apply")


def meta_schema(extras: int) -> Schema:
    """`finite` 0: the worker's gradient holds NaN or Inf (checked whole, so every server gets
    the same flag and server 0 drops it on all of them)."""
    return Schema("kind", "version", "sent", "want_state", "finite", ("extras", extras))


def interval_schema(workers: int, extras: int) -> Schema:
    """Since the asking worker's previous reply: gradients applied and dropped (all workers)
    and the summed staleness of those applied; per worker, its reports and gradients applied;
    the side channel summed over every message in between."""
    return Schema("contributors", "dropped", "staleness", ("reports", workers),
                  ("applied", workers), ("extras", extras))


def control_schema(workers: int) -> Schema:
    return Schema("op", "count", ("workers", workers), dtype=np.int64)


def is_server(cfg: Config, world: World) -> bool:
    return cfg.sync.mode == "ps" and world.rank >= world.size - cfg.sync.ps


def check(cfg: Config, world_size: int) -> Layout:
    """The PS options against the world size."""
    s = cfg.sync
    if world_size <= s.ps:
        raise DdrlError(f"sync.mode = 'ps' with sync.ps = {s.ps} needs at least {s.ps + 1} ranks "
                        f"(one worker or more), got {world_size}")
    layout = Layout.of(s.ps, world_size)
    servers = [r for r in cfg.debug.slow_ranks if r >= layout.workers]
    if servers:
        raise DdrlError(f"config key debug.slow_ranks: rank {servers[0]} is a parameter server "
                        f"(workers are ranks 0..{layout.workers - 1})")
    quorum(s.aggregate, layout.workers)
    return layout


def split(cfg: Config, world: World):
    """Check the PS options against the world, then give the workers a communicator of their
    own, as if they were the whole job: (layout, this rank's part of the split). Every rank,
    server or worker, calls it at the same point (the split is collective)."""
    layout = check(cfg, world.size)
    return layout, world.comm.Split(int(is_server(cfg, world)), world.rank)


@dataclass(frozen=True)
class Layout:
    workers: int
    servers: int

    @classmethod
    def of(cls, ps: int, world_size: int) -> "Layout":
        return cls(world_size - ps, ps)

    def server_rank(self, s: int) -> int:
        return self.workers + s

    def bounds(self, num_params: int) -> list[tuple[int, int]]:
        """Contiguous slices of equal size: every parameter is float32, so equal counts are
        equal bytes on the wire and equal Adam work per server."""
        edges = np.linspace(0, num_params, self.servers + 1).round().astype(int)
        return [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:])]



def quorum(aggregate: float, workers: int) -> int:
    """Gradients per synchronous update: a fraction of the workers (rounded up, so 0.9 means
    at least 90%) when aggregate <= 1, else a count."""
    if aggregate <= 1:
        return max(1, math.ceil(aggregate * workers - 1e-9))
    if not float(aggregate).is_integer():
        raise DdrlError(f"config key sync.aggregate: {aggregate} is neither a fraction <= 1 "
                        "nor a whole number of workers")
    if aggregate > workers:
        raise DdrlError(f"config key sync.aggregate: {int(aggregate)} gradients per update but "
                        f"only {workers} worker rank(s)")
    return int(aggregate)
