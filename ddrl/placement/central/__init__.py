"""Central inference (SEED RL): rank 0, the learner, infers for every actor rank and trains;
the actor ranks only simulate (they never load TensorFlow). The wire protocol is
distributed/central.py; the learner's actors, over the remote simulators, are `actors.py`."""
from __future__ import annotations

from ddrl.config import Config
from ddrl.distributed import central
from ddrl.distributed.world import World
from ddrl.errors import DdrlError
from ddrl.placement import no_virtual_ranks


class Central:
    # A heterogeneous job: the learner's component and the actors' (slurm/central.sbatch).
    slurm_template = "central.sbatch"

    @staticmethod
    def check_config(cfg: Config) -> None:
        no_virtual_ranks(cfg)
        if cfg.sync.backend != "mpi":
            raise DdrlError("sync.mode = 'central' sends with mpi4py point to point: set "
                            "sync.backend = 'mpi'")
        if cfg.acting.mode not in ("ba3c", "dqn"):
            raise DdrlError("sync.mode = 'central': the learner runs the ba3c node (its FIFO of "
                            "unrolls) or DQN's (its replay memory); set acting.mode = 'ba3c' or 'dqn'")

    @staticmethod
    def check(cfg: Config, world_size: int) -> None:
        central.check(cfg, world_size)

    @staticmethod
    def trainer_ranks(cfg: Config, world_size: int) -> int:
        return 1

    def __init__(self, cfg: Config, world: World):
        self.cfg, self.world = cfg, world
        self._comm = self._pool = self._beat = None

    def start(self, restarts: int) -> int:
        self._comm = central.split(self.world)
        restarts = central.share_restarts(self.world, restarts)
        if self.trains:  # until `actors`, the last of the learner's start-up
            self._beat = central.StartupBeat(self.world, min(5.0, self.cfg.sync.timeout / 2))
        return restarts

    @property
    def trains(self) -> bool:
        return not central.is_actor(self.cfg, self.world)

    def serve(self, restarts: int) -> int:
        # Simulators only, until the learner, which checkpoints, stops it, whatever signals
        # this rank receives.
        return central.run_actor(self.cfg, self.world, restarts)

    def sync(self, learner, spec):
        from ddrl.envs import frames_per_step

        self._pool = central.RemotePool(self.cfg, self.world.comm, self.world.size - 1, *spec,
                                        frames_per_step(self.cfg))
        return central.CentralSync(self.world, self._comm, self._pool, self.cfg.sync.timeout)

    def actors(self, learner, restarts: int):
        from ddrl.placement.central.actors import central_actors

        self._beat.stop()
        return central_actors(self.cfg, learner, restarts, self._pool)


PLACEMENT = Central
