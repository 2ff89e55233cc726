"""Who am I in the job: rank, world size, local rank and node count, from MPI and Slurm.

MPI is initialised only when the process was started by a launcher (mpirun, srun) or the
job asks for a backend that needs it, so a plain `ddrl train` needs no MPI at all.
"""
from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ddrl.errors import DdrlError

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID")


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    # Machines the ranks run on (Slurm calls them nodes; in ddrl a "node" is one rank's
    # actors and learner, as in the paper).
    hosts: int = 1
    comm: Any = None
    # The CPUs the job's ranks on this machine are bound to, all of them: where rank 0's
    # evaluator may use the time a rank leaves idle (empty: this process's own). By name only,
    # so that the worlds built on this one (ps_worker's, central's) keep their positions.
    node_cpus: frozenset[int] = field(default=frozenset(), kw_only=True)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self, timeout: float = math.inf, what: str = "") -> None:
        """Polls with sleeps: a blocking MPI barrier spins a core that rank 0 may need. Past
        `timeout` seconds the whole job ends (MPI_Abort also takes down a rank that hangs),
        the message naming `what` it waited for."""
        if self.comm is None:
            return
        request, deadline = self.comm.Ibarrier(), time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                from ddrl.distributed.waiting import abort

                abort(self.comm, f"rank {self.rank} waited {timeout:g} s (sync.timeout) for the "
                      f"other ranks {what}: one is frozen or lost; what this rank wrote is kept")
            time.sleep(0.02)


def launcher_rank() -> int:
    """This process's rank as the launcher set it, read without starting MPI (0 when alone)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def launched_by_mpi_or_slurm() -> bool:
    return any(v in os.environ for v in _LAUNCHER_VARS)


def _slurm_expected_tasks() -> int | None:
    """Tasks Slurm launched in this step, when srun (not Open MPI's mpirun) started us."""
    if "SLURM_PROCID" not in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ:
        return None
    value = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
    return int(value) if value and value.isdigit() else None


def discover(need_mpi: bool) -> World:
    """Raise a one-line error when Slurm says N tasks but MPI sees a different world
    (srun without PMIx starts N singletons that would overwrite each other's run)."""
    if need_mpi or launched_by_mpi_or_slurm():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        hosts = comm.allgather(socket.gethostname())
        node_cpus = frozenset().union(*local.allgather(os.sched_getaffinity(0)))
        world = World(comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size(),
                      len(set(hosts)), comm, node_cpus=node_cpus)
    else:
        world = World(node_cpus=frozenset(os.sched_getaffinity(0)))
    expected = _slurm_expected_tasks()
    if expected is not None and expected != world.size:
        raise DdrlError(
            f"Slurm started {expected} tasks but the MPI world has {world.size} rank(s): "
            "launch with `srun --mpi=pmix` (or pmi2) or `mpirun`, so the ranks form one job")
    return world
