"""Gradient synchronisation: every backend turns each rank's flat gradient into one update.

All backends share one step: (flat gradient, side channel) -> update applied. The side
channel is a small float vector summed across ranks in the same collective (frames done,
stop requests, per-rank timings), so control decisions cost no extra round trip.
Parameter-server mode (ddrl/distributed/ps*.py) keeps the same interface on its worker ranks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ddrl.config import Config
from ddrl.distributed.world import World
from ddrl.errors import DdrlError
from ddrl.node.learner import Learner


@dataclass
class SyncResult:
    """`extras` sums the side channel of every rank's step since this rank's previous one.
    `contributors`, `dropped` and the mean `staleness` count the gradients applied and
    dropped in that interval. The optional fields come from parameter servers: per worker,
    the steps it reported and its gradients applied in the interval (`messages`, `applied`;
    None means one each), and each server's cumulative figures (`servers`, ps.STATUS)."""
    extras: np.ndarray
    contributors: int
    seconds: float
    dropped: int = 0
    staleness: float = 0.0
    applied: np.ndarray | None = None
    messages: np.ndarray | None = None
    servers: list[dict[str, float]] = field(default_factory=list)


def bcast(comm, array: np.ndarray) -> np.ndarray:
    array = np.array(array, order="C")
    comm.Bcast(array, root=0)
    return array


class LocalSync:
    """One rank: the gradient is the update."""

    name = "none"
    # Parameter-server ranks have role "server" and run ParameterServer.serve instead.
    role = "worker"

    def __init__(self, world: World):
        # The ranks that run the trainer loop (in PS mode, the workers only).
        self.world = world

    @property
    def workers(self) -> int:
        return self.world.size

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return array

    def update(self, learner: Learner, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        learner.apply(grad)
        return SyncResult(extras, 1, 0.0)

    def pull_state(self, learner: Learner) -> None:
        """Make the learner's weights and Adam state the current ones before a checkpoint
        (they live on the parameter servers in PS mode)."""

    def finish(self, learner: Learner) -> SyncResult | None:
        """The last exchange, once this rank has left the update loop: PS workers all end
        with the servers' final weights (and the chief with their Adam state)."""
        return None

    def close(self) -> None:
        pass


class MpiAllreduceSync(LocalSync):
    """mpi4py buffer Allreduce, in place, on one float32 buffer: gradient then side channel."""

    name = "mpi"

    def __init__(self, world: World):
        super().__init__(world)
        self._buf: np.ndarray | None = None

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return bcast(self.world.comm, array)

    def allreduce_sum(self, buf: np.ndarray) -> None:
        from mpi4py import MPI

        self.world.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def update(self, learner: Learner, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        n = grad.size
        if self._buf is None or self._buf.size != n + extras.size:
            self._buf = np.empty(n + extras.size, np.float32)
        self._buf[:n] = grad
        self._buf[n:] = extras
        start = time.perf_counter()
        self.allreduce_sum(self._buf)
        seconds = time.perf_counter() - start
        learner.apply(self._buf[:n] / self.world.size)
        return SyncResult(self._buf[n:].copy(), self.world.size, seconds)


class HorovodSync(MpiAllreduceSync):
    """Horovod's ring all-reduce on the same fused buffer (one tensor, so one fused op)."""

    name = "horovod"

    def __init__(self, world: World):
        super().__init__(world)
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


def make_sync(cfg: Config, world: World):
    """This rank's side of the synchronisation: a LocalSync (trainer ranks) or, on the last
    sync.ps ranks in PS mode, a ParameterServer."""
    backend = cfg.sync.backend
    if cfg.sync.mode == "ps":
        from ddrl.distributed.ps import make_ps

        return make_ps(cfg, world)
    if cfg.sync.aggregate != 1 or cfg.sync.async_:
        # A collective completes only when every rank has joined it and cannot be cancelled,
        # so neither leaving out late ranks nor applying early ones fits an all-reduce.
        raise DdrlError("sync.aggregate != 1 (k-of-n) and sync.async = true need sync.mode = 'ps'")
    if world.size == 1:
        return LocalSync(world)
    if backend == "none":
        raise DdrlError(f"{world.size} ranks but sync.backend = 'none': use 'mpi' or 'horovod'")
    return {"mpi": MpiAllreduceSync, "horovod": HorovodSync}[backend](world)
