"""Gradient synchronisation: every backend turns each rank's flat gradient into one update.

All backends share one step: (flat gradient, side channel) -> update applied. The side
channel is a small float vector summed across ranks in the same collective (frames done,
stop requests, per-rank timings), so control decisions cost no extra round trip.
`Sync` is all the trainer knows of a backend; parameter-server mode (ddrl/distributed/ps*.py)
implements it on its worker ranks, and its server ranks run their own loop instead.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ddrl.config import Config
from ddrl.distributed.waiting import RollCall, Watchdog, wait_all
from ddrl.distributed.world import World
from ddrl.errors import DdrlError

if TYPE_CHECKING:  # the learner brings TensorFlow, which check_world must not wait for
    from ddrl.node.learner import Learner


@dataclass
class SyncResult:
    """`extras` sums the side channel of every rank's step since this rank's previous one.
    `contributors`, `dropped` and the mean `staleness` count the gradients applied and
    dropped in that interval. Per trainer rank, `reports` counts the steps summed into its
    part of `extras` and `applied` its gradients applied (None: one each, as in an
    all-reduce). `rows` is the backend's own telemetry for the run log: table -> rows.
    `finite` False: the summed gradient held NaN or Inf and no rank applied it."""
    extras: np.ndarray
    contributors: int
    seconds: float
    dropped: int = 0
    staleness: float = 0.0
    reports: np.ndarray | None = None
    applied: np.ndarray | None = None
    rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    finite: bool = True


def apply_if_finite(learner: Learner, mean_grad: np.ndarray, extras: np.ndarray, ranks: int,
                    seconds: float) -> SyncResult:
    """One NaN or Inf on any rank makes the sum non-finite, so every rank sees the same sum
    and drops the same update: the weights and Adam state never take it in."""
    if not np.isfinite(mean_grad).all():
        return SyncResult(extras, 0, seconds, dropped=ranks, finite=False)
    learner.apply(mean_grad)
    return SyncResult(extras, ranks, seconds)


class Sync(Protocol):
    """What the trainer loop needs of a backend, whichever it is."""

    name: str
    # The ranks that run the trainer loop, as one world of their own.
    world: World

    @property
    def workers(self) -> int: ...

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        """Rank 0's array on every rank of the job."""

    def update(self, learner: Learner, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        """Send this rank's gradient and side channel; the learner ends on the new weights."""

    def pull_state(self, learner: Learner) -> None:
        """Make the learner's weights and Adam state the current ones, before a checkpoint."""

    def finish(self, learner: Learner) -> SyncResult | None:
        """The last exchange, once this rank has left the update loop."""

    def close(self) -> None: ...


def bcast(comm, array: np.ndarray) -> np.ndarray:
    array = np.array(array, order="C")
    comm.Bcast(array, root=0)
    return array


class LocalSync:
    """One rank: the gradient is the update."""

    name = "none"

    def __init__(self, world: World):
        self.world = world

    @property
    def workers(self) -> int:
        return self.world.size

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return array

    def update(self, learner: Learner, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        return apply_if_finite(learner, grad, extras, 1, 0.0)

    def pull_state(self, learner: Learner) -> None:
        pass

    def finish(self, learner: Learner) -> SyncResult | None:
        return None

    def close(self) -> None:
        pass


class MpiAllreduceSync(LocalSync):
    """mpi4py buffer Allreduce, in place, on one float32 buffer: gradient then side channel.

    Open MPI's blocking collectives busy-poll, so a rank waiting for a slower one would take
    a core from the simulators beside it. Each all-reduce therefore first waits for all ranks
    to arrive at a nonblocking barrier, polled with growing sleeps, and only then runs the
    fast blocking Allreduce (a nonblocking Iallreduce polled the same way was 1.3-2.5x slower:
    it progresses only while it is tested)."""

    name = "mpi"

    def __init__(self, world: World, timeout: float):
        super().__init__(world)
        self._buf: np.ndarray | None = None
        self._calls = 0
        # A rank that never joins (frozen, or its node lost without the launcher noticing)
        # would hold the others in the all-reduce forever.
        self._watchdog = Watchdog(timeout, lambda silent: (
            f"rank {world.rank} waited {timeout:g} s (sync.timeout) in all-reduce {self._calls} "
            f"for {_ranks(silent)}: frozen or lost; ending the job"),
            RollCall(world.comm, grace=min(30.0, max(5.0, timeout / 10))))

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return bcast(self.world.comm, array)

    def allreduce_sum(self, buf: np.ndarray) -> None:
        from mpi4py import MPI

        comm = self.world.comm
        wait_all([comm.Ibarrier()], math.inf, spin=2e-3)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def update(self, learner: Learner, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        n = grad.size
        if self._buf is None or self._buf.size != n + extras.size:
            self._buf = np.empty(n + extras.size, np.float32)
        self._buf[:n] = grad
        self._buf[n:] = extras
        start = time.perf_counter()
        self._calls += 1
        with self._watchdog:
            self.allreduce_sum(self._buf)
        seconds = time.perf_counter() - start
        return apply_if_finite(learner, self._buf[:n] / self.world.size, self._buf[n:].copy(),
                               self.world.size, seconds)


def _ranks(ranks: list[int] | None) -> str:
    if ranks is None:
        return "the other rank(s)"
    if not ranks:
        return "the others, all waiting too (the network between them?)"
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}, which never joined"


class HorovodSync(MpiAllreduceSync):
    """Horovod's ring all-reduce on the same fused buffer (one tensor, so one fused op)."""

    name = "horovod"

    def __init__(self, world: World, timeout: float):
        super().__init__(world, timeout)
        try:
            import horovod.tensorflow as hvd
        except ImportError as exc:
            raise DdrlError(f"sync.backend = 'horovod' but Horovod is not importable ({exc}); "
                            "run `make setup` or use sync.backend = 'mpi'") from None
        hvd.init()
        if hvd.size() != world.size:
            raise DdrlError(f"Horovod sees {hvd.size()} ranks but MPI sees {world.size}")
        self._hvd = hvd

    def allreduce_sum(self, buf: np.ndarray) -> None:
        import tensorflow as tf

        buf[:] = self._hvd.allreduce(tf.constant(buf), op=self._hvd.Sum, name="ddrl_grad").numpy()

    def close(self) -> None:
        self._hvd.shutdown()


def check_world(cfg: Config, world_size: int) -> None:
    """The sync options against the world size: every rank reaches the same verdict, before
    TensorFlow or the simulators start."""
    if cfg.sync.mode == "ps":
        from ddrl.distributed.ps import check

        check(cfg, world_size)
        return
    if cfg.sync.aggregate != 1 or cfg.sync.async_:
        # A collective completes only when every rank has joined it and cannot be cancelled,
        # so neither leaving out late ranks nor applying early ones fits an all-reduce.
        raise DdrlError("sync.aggregate != 1 (k-of-n) and sync.async = true need sync.mode = 'ps'")
    if world_size > 1 and cfg.sync.backend == "none":
        raise DdrlError(f"{world_size} ranks but sync.backend = 'none': use 'mpi' or 'horovod'")


def make_sync(cfg: Config, world: World) -> Sync:
    """The backend of a rank that runs the trainer loop (in PS mode, a worker rank), once
    `check_world` has passed."""
    if cfg.sync.mode == "ps":
        from ddrl.distributed.ps_worker import PsSync

        return PsSync(cfg, world)
    if world.size == 1:
        return LocalSync(world)
    return {"mpi": MpiAllreduceSync, "horovod": HorovodSync}[cfg.sync.backend](world, cfg.sync.timeout)
