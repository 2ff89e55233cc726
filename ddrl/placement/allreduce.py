"""Homogeneous ranks, each a whole node (simulators, predictors, trainer), combining every
update's gradients in one all-reduce (mpi4py or Horovod); with `sync.virtual_ranks`, each
process carries several ranks of the job (acting/virtual.py)."""
from __future__ import annotations

import importlib.util

from ddrl.config import Config
from ddrl.errors import DdrlError
from ddrl.placement import NodeRanks


class AllReduce(NodeRanks):
    slurm_template = None

    @staticmethod
    def check_config(cfg: Config) -> None:
        if cfg.sync.aggregate != 1 or cfg.sync.async_:
            # A collective completes only when every rank has joined it and cannot be
            # cancelled, so neither leaving out late ranks nor applying early ones fits it.
            raise DdrlError("sync.aggregate != 1 (k-of-n) and sync.async = true need "
                            "sync.mode = 'ps'")
        o = cfg.optim
        if cfg.sync.virtual_fused and (o.clip_per_tensor > 0 or
                                       (o.max_grad_norm > 0 and o.clip_scope == "rank")):
            # Each rank's clip needs each rank's own gradient, which the one call never forms.
            raise DdrlError("config key sync.virtual_fused: one gradient for all virtual ranks "
                            "cannot clip each rank's: set optim.clip_scope = 'sync' (or "
                            "optim.max_grad_norm = 0) and optim.clip_per_tensor = 0")

    @staticmethod
    def check(cfg: Config, world_size: int) -> None:
        if world_size > 1 and cfg.sync.backend == "none":
            raise DdrlError(f"{world_size} ranks but sync.backend = 'none': use 'mpi' or "
                            "'horovod'")
        if world_size > 1 and cfg.sync.backend == "horovod" and \
                importlib.util.find_spec("horovod") is None:
            raise DdrlError("sync.backend = 'horovod' but Horovod is not installed: install the "
                            "'horovod' extra (docs/install.md) or use sync.backend = 'mpi'")

    @staticmethod
    def trainer_ranks(cfg: Config, world_size: int) -> int:
        return world_size * cfg.sync.virtual_ranks

    @property
    def trains(self) -> bool:
        return True

    def serve(self, restarts: int) -> int:
        raise AssertionError("every all-reduce rank trains")

    def sync(self, learner, spec):
        from ddrl.distributed.sync import LocalSync

        virtual = self.cfg.sync.virtual_ranks
        if self.world.size == 1:
            return LocalSync(self.world, virtual)
        from ddrl.distributed.allreduce import HorovodSync, MpiAllreduceSync

        backend = {"mpi": MpiAllreduceSync, "horovod": HorovodSync}[self.cfg.sync.backend]
        return backend(self.world, self.cfg.sync.timeout, virtual)


PLACEMENT = AllReduce
