"""Which sync backend a job gets, checked against the world before anything heavy starts."""
from __future__ import annotations

import importlib.util

from ddrl.config import Config
from ddrl.distributed import central
from ddrl.distributed.ps import Layout, check
from ddrl.distributed.sync import LocalSync, Sync
from ddrl.distributed.world import World
from ddrl.errors import DdrlError


def check_world(cfg: Config, world_size: int) -> None:
    """The sync options against the world size: every rank reaches the same verdict, before
    TensorFlow or the simulators start."""
    if cfg.sync.mode == "ps":
        check(cfg, world_size)
        return
    if cfg.sync.mode == "central":
        central.check(cfg, world_size)
        return
    if cfg.sync.aggregate != 1 or cfg.sync.async_:
        # A collective completes only when every rank has joined it and cannot be cancelled,
        # so neither leaving out late ranks nor applying early ones fits an all-reduce.
        raise DdrlError("sync.aggregate != 1 (k-of-n) and sync.async = true need sync.mode = 'ps'")
    if world_size > 1 and cfg.sync.backend == "none":
        raise DdrlError(f"{world_size} ranks but sync.backend = 'none': use 'mpi' or 'horovod'")
    if world_size > 1 and cfg.sync.backend == "horovod" and importlib.util.find_spec("horovod") is None:
        raise DdrlError("sync.backend = 'horovod' but Horovod is not installed: install the "
                        "'horovod' extra (docs/install.md) or use sync.backend = 'mpi'")


def trainer_ranks(cfg: Config, world_size: int) -> int:
    """The ranks that compute gradients, virtual ones included (the learning rate scales
    with them)."""
    if cfg.sync.mode == "central":
        return 1
    if cfg.sync.mode == "ps":
        return Layout.of(cfg.sync.ps, world_size).workers
    return world_size * cfg.sync.virtual_ranks


def make_sync(cfg: Config, world: World, num_params: int) -> Sync:
    """The backend of a rank that runs the trainer loop (in PS mode, a worker rank), once
    `check_world` has passed."""
    if cfg.sync.mode == "ps":
        from ddrl.distributed.ps_worker import PsSync

        return PsSync(cfg, world, num_params)
    virtual = cfg.sync.virtual_ranks
    if world.size == 1:
        return LocalSync(world, virtual)
    from ddrl.distributed.allreduce import HorovodSync, MpiAllreduceSync

    backend = {"mpi": MpiAllreduceSync, "horovod": HorovodSync}[cfg.sync.backend]
    return backend(world, cfg.sync.timeout, virtual)
