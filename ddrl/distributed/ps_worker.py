"""The worker side of parameter-server mode: the trainer's `update` becomes one exchange with
every server (gradient slices out, weight slices of the next version back)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddrl.config import Config
from ddrl.distributed.ps import (
    BYE,
    DATA,
    GRAD,
    META,
    MOMENT,
    REPLY,
    STATE,
    STATUS,
    VELOCITY,
    WEIGHTS,
    interval_schema,
    meta_schema,
    split,
)
from ddrl.distributed.sync import LocalSync, SyncResult, Update, bcast
from ddrl.distributed.waiting import abort, wait_all
from ddrl.distributed.world import World
from ddrl.errors import DdrlError
from ddrl.optim import AdamMoments


@dataclass
class WorkerWorld(World):
    """The worker ranks as the trainer sees them: a communicator without the servers."""
    job_comm: Any = None
    # Workers left out after sync.timeout of silence, as server 0 reported at the end.
    lost: int = 0

    def barrier(self, timeout: float = math.inf, what: str = "") -> None:
        if self.lost and self.is_root:
            # A left-out worker never arrives, and may hang rather than be dead: rank 0 has
            # saved by now, and only MPI_Abort also ends a hung rank.
            abort(self.job_comm, f"{self.lost} worker rank(s) sent nothing for sync.timeout "
                                 "and were left out; the run is saved; ending the job")
        super().barrier(timeout, what)


class PsSync(LocalSync):
    name = "ps"
    lockstep = False

    def __init__(self, cfg: Config, world: World, num_params: int):
        layout, own_comm = split(cfg, world)
        super().__init__(WorkerWorld(world.rank, layout.workers, world.local_rank,
                                     world.local_size, world.hosts, own_comm,
                                     node_cpus=world.node_cpus, job_comm=world.comm))
        self._job = world
        self._comm = world.comm
        self._layout = layout
        # Longer than a server waits for a silent worker, so that the server's decision (go on
        # without it) comes first; past it, a server must be dead or hung.
        self._deadline = 2 * cfg.sync.timeout + 10
        self._version = 0
        self._sent = 0
        self._extras = 0  # the side channel's size, fixed by the trainer's first update
        self._weights = np.empty(num_params, np.float32)
        self._finished = False

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        # The servers take their slices from rank 0's weights and Adam state, so they join in.
        return bcast(self._comm, array)

    def update(self, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        start = time.perf_counter()
        self._sent += 1
        self._extras = extras.size
        finite = bool(np.isfinite(grad).all())
        replies, update = self._exchange(GRAD, grad=grad, extras=extras, finite=finite)
        res = self._result(replies, update, time.perf_counter() - start)
        res.finite = finite
        return res

    def pull_state(self) -> Update:
        if self._finished:
            return Update()
        return self._exchange(STATE, state=True)[1]

    def finish(self) -> SyncResult:
        start = time.perf_counter()
        replies, update = self._exchange(BYE, state=self.world.is_root)
        self._finished = True
        res = self._result(replies, update, time.perf_counter() - start)
        self.world.lost = int(res.rows["servers"][0]["lost"])
        return res

    def close(self) -> None:
        if self._finished:
            # The workers' barrier (also the trainer's last step) ends the job if some were
            # left out; the job's barrier holds the servers until rank 0 has saved.
            self.world.barrier()
            self._job.barrier()

    def _exchange(self, kind: int, grad: np.ndarray | None = None,
                  extras: np.ndarray | None = None, state: bool = False,
                  finite: bool = True) -> tuple[list[np.ndarray], Update]:
        """Send to every server, take back its weight slice (and Adam moments), all slices of
        one version by the sequencing of server 0: the servers' replies, and those weights."""
        comm, layout = self._comm, self._layout
        bounds = layout.bounds(self._weights.size)
        moments = [np.empty_like(self._weights) for _ in range(2)] if state else []
        replies = [np.empty(STATUS.size + interval_schema(layout.workers, self._extras).size)
                   for _ in bounds]
        requests = []
        # Receives first, so the replies land in place rather than in MPI's unexpected queue.
        for s, (lo, hi) in enumerate(bounds):
            src = layout.server_rank(s)
            requests.append(comm.Irecv(replies[s], src, REPLY))
            for buf, tag in zip([self._weights, *moments], (WEIGHTS, MOMENT, VELOCITY)):
                requests.append(comm.Irecv(buf[lo:hi], src, tag))
        for s, (lo, hi) in enumerate(bounds):
            if kind == STATE and s > 0:
                continue  # server 0 orders the snapshot on the others
            dest = layout.server_rank(s)
            # Only server 0 sums the side channel; the others get the head alone.
            side = extras if s == 0 and extras is not None else np.zeros(self._extras if s == 0 else 0)
            meta = meta_schema(side.size).pack(kind=kind, version=self._version, sent=self._sent,
                                               want_state=float(state), finite=float(finite),
                                               extras=side)
            requests.append(comm.Isend(meta, dest, META))
            if grad is not None:
                requests.append(comm.Isend(grad[lo:hi], dest, DATA))
        if not wait_all(requests, self._deadline):
            raise DdrlError(f"no answer from the parameter servers within {self._deadline:.0f} s "
                            "(2 x sync.timeout + 10 s): a server rank died or hangs")
        versions = {int(STATUS.get(r, "version")) for r in replies}
        if len(versions) != 1:
            raise RuntimeError(f"parameter servers answered with versions {sorted(versions)}")
        self._version = versions.pop()
        adam = AdamMoments(int(STATUS.get(replies[0], "iterations")), *moments) if state else None
        return replies, Update(weights=self._weights, moments=adam)

    def _result(self, replies: list[np.ndarray], update: Update, seconds: float) -> SyncResult:
        part = interval_schema(self._layout.workers, self._extras).unpack(replies[0][STATUS.size:])
        contributors = int(part["contributors"])
        return SyncResult(
            part["extras"].astype(np.float32), contributors, seconds, update, int(part["dropped"]),
            part["staleness"] / contributors if contributors else 0.0,
            reports=part["reports"].astype(np.int64), applied=part["applied"].astype(np.int64),
            rows={"servers": [{"server": s, **STATUS.unpack(r)} for s, r in enumerate(replies)]})
