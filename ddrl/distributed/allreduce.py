"""The all-reduce backends: every rank sends its gradient into one collective sum."""
from __future__ import annotations

import math
import time

import numpy as np

from ddrl.distributed.sync import LocalSync, SyncResult, bcast, mean_gradient
from ddrl.distributed.waiting import collective_watchdog, wait_all
from ddrl.distributed.world import World
from ddrl.errors import DdrlError


class MpiAllreduceSync(LocalSync):
    """mpi4py buffer Allreduce, in place, on one float32 buffer: gradient then side channel.

    Open MPI's blocking collectives busy-poll, so a rank waiting for a slower one would take
    a core from the simulators beside it. Each all-reduce therefore first waits for all ranks
    to arrive at a nonblocking barrier, polled with growing sleeps, and only then runs the
    fast blocking Allreduce (a nonblocking Iallreduce polled the same way was 1.3-2.5x slower:
    it progresses only while it is tested)."""

    name = "mpi"

    def __init__(self, world: World, timeout: float, virtual: int = 1):
        super().__init__(world, virtual)
        self._buf: np.ndarray | None = None
        self._calls = 0
        # A rank that never joins (frozen, or its node lost without the launcher noticing)
        # would hold the others in the all-reduce forever.
        self._watchdog = collective_watchdog(world, timeout, lambda: f"all-reduce {self._calls}")

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return bcast(self.world.comm, array)

    def allreduce_sum(self, buf: np.ndarray) -> None:
        from mpi4py import MPI

        comm = self.world.comm
        wait_all([comm.Ibarrier()], math.inf, spin=2e-3)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def update(self, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
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
        return mean_gradient(self._buf[:n] / self.contributors, self._buf[n:].copy(),
                             self.contributors, seconds)


class HorovodSync(MpiAllreduceSync):
    """Horovod's ring all-reduce on the same fused buffer (one tensor, so one fused op)."""

    name = "horovod"

    def __init__(self, world: World, timeout: float, virtual: int = 1):
        super().__init__(world, timeout, virtual)
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
