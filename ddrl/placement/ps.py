"""Parameter-server ranks (the paper's layout): the last `sync.ps` ranks hold slices of the
weights and Adam's state; the workers send them gradients, synchronously, k-of-n
(`sync.aggregate`) or asynchronously (`sync.async`). The mechanics are
distributed/ps*.py."""
from __future__ import annotations

from ddrl.config import Config
from ddrl.distributed.ps import Layout, check, is_server
from ddrl.errors import DdrlError
from ddrl.placement import NodeRanks, no_virtual_ranks


class ParameterServers(NodeRanks):
    slurm_template = None

    @staticmethod
    def check_config(cfg: Config) -> None:
        no_virtual_ranks(cfg)
        s = cfg.sync
        if s.ps < 1:
            raise DdrlError("config key sync.ps: sync.mode = 'ps' needs at least 1 parameter server")
        if s.backend != "mpi":
            raise DdrlError("sync.mode = 'ps' sends with mpi4py point to point: set sync.backend = 'mpi'")
        if s.async_ and s.aggregate != 1:
            raise DdrlError("config key sync.aggregate: with sync.async = true every gradient is "
                            "applied on arrival; k-of-n is for synchronous updates")
        if cfg.optim.clip_scope != "rank":
            raise DdrlError("config key optim.clip_scope: parameter servers apply each worker's "
                            "gradient as it comes; set optim.clip_scope = 'rank'")
        if cfg.algo.name == "dqn":
            raise DdrlError("config key sync.mode: DQN sums every minibatch gradient across ranks; "
                            "use sync.mode = 'allreduce'")
        # The servers run Adam with the rate they started with.
        for key, value in (("lr_schedule", cfg.optim.lr_schedule != "constant"),
                           ("warmup_frames", cfg.optim.warmup_frames)):
            if value:
                raise DdrlError(f"config key optim.{key}: parameter servers keep a constant "
                                "learning rate; use sync.mode = 'allreduce'")

    @staticmethod
    def check(cfg: Config, world_size: int) -> None:
        check(cfg, world_size)

    @staticmethod
    def trainer_ranks(cfg: Config, world_size: int) -> int:
        return Layout.of(cfg.sync.ps, world_size).workers

    @property
    def trains(self) -> bool:
        return not is_server(self.cfg, self.world)

    def serve(self, restarts: int) -> int:
        from ddrl.cpus import start_tensorflow
        from ddrl.distributed.ps_server import serve
        from ddrl.envs import env_spec

        # A server holds a slice of the weights and runs no simulators; it leaves after the
        # workers.
        start_tensorflow(self.cfg, self.world.local_size)
        return serve(self.cfg, self.world, *env_spec(self.cfg))

    def sync(self, learner, spec):
        from ddrl.distributed.ps_worker import PsSync

        return PsSync(self.cfg, self.world, learner.num_params)


PLACEMENT = ParameterServers
