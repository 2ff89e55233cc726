"""Placement: where a job's ranks go and what each does, one module per way of placing them.

A placement says which ranks train, which serve (parameter servers) and which only simulate
(central mode's actors); the sync a trainer gets and the actors it drives; its own check of
the config against the world; and the Slurm template it needs. `ddrl.commands.train` asks it, in this
order: `check_config` (wherever a job file is read: `load_job`), `check` (against the
world, before anything heavy), `start` (the layout's collectives), `trains` and
`serve` for the ranks that do not train, then `sync` and `actors` for those that do.

A new placement is a module here with a class of this shape and one line in PLACEMENTS.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from ddrl.config import Config, load_config
from ddrl.distributed.world import World
from ddrl.errors import DdrlError

if TYPE_CHECKING:  # both bring TensorFlow, which the config check must not wait for
    import numpy as np

    from ddrl.acting.base import Actors
    from ddrl.distributed.sync import Sync
    from ddrl.learner import Learner

# sync.mode -> the module whose PLACEMENT is its class; imported only when chosen.
PLACEMENTS = {
    "allreduce": "ddrl.placement.allreduce",
    "ps": "ddrl.placement.ps",
    "central": "ddrl.placement.central",
}
Spec = tuple[tuple[int, ...], "np.dtype", int]  # observation shape, dtype, actions


class Placement(Protocol):
    # The sbatch template under slurm/ the job needs whatever `ddrl slurm`'s options say
    # (central mode's heterogeneous job), or None: the options choose (one node type).
    slurm_template: str | None

    @staticmethod
    def check_config(cfg: Config) -> None:
        """The combinations of keys this placement cannot run, whatever the world: `ddrl
        slurm`, `sweep` and every `bench` refuse them as `ddrl train` does."""

    @staticmethod
    def check(cfg: Config, world_size: int) -> None:
        """The placement's options against the world size: every rank reaches the same
        verdict, before TensorFlow or the simulators start."""

    @staticmethod
    def trainer_ranks(cfg: Config, world_size: int) -> int:
        """The ranks of the job that compute gradients, virtual ones included (the learning
        rate scales with them)."""

    def __init__(self, cfg: Config, world: World) -> None: ...

    def start(self, restarts: int) -> int:
        """The layout's own collectives, on every rank; the restart count all ranks agree on."""

    @property
    def trains(self) -> bool:
        """Whether this rank runs the trainer loop."""

    def serve(self, restarts: int) -> int:
        """A rank that does not train: its own loop, until the trainers end the job; its exit
        code."""

    def sync(self, learner: "Learner", spec: Spec) -> "Sync":
        """A trainer's sync (its `world` holds the trainer ranks only)."""

    def actors(self, learner: "Learner", restarts: int) -> "Actors":
        """A trainer's actors, once `sync` is made."""


class NodeRanks:
    """What the placements whose trainers are whole nodes share: no collectives of their own
    at start, every trainer its own rank's actors (or its virtual ranks')."""

    def __init__(self, cfg: Config, world: World):
        self.cfg, self.world = cfg, world

    def start(self, restarts: int) -> int:
        return restarts

    def actors(self, learner: "Learner", restarts: int) -> "Actors":
        from ddrl.acting import make_actors

        return make_actors(self.cfg, learner, self.world.rank, restarts)


def placement_of(cfg: Config) -> type[Placement]:
    return importlib.import_module(PLACEMENTS[cfg.sync.mode]).PLACEMENT


def no_virtual_ranks(cfg: Config) -> None:
    """For placements whose outcome depends on when each rank's message arrives (k-of-n,
    asynchronous updates, central inference), which a process that computes its ranks one
    after another cannot rehearse."""
    if cfg.sync.virtual_ranks > 1:
        raise DdrlError(f"config key sync.virtual_ranks: {cfg.sync.virtual_ranks} virtual ranks "
                        f"need sync.mode = 'allreduce' (not {cfg.sync.mode!r})")


def check_config(cfg: Config) -> None:
    """The checks of the rooms above config.py: the actors' (`ddrl.acting.check_config`),
    then the placement's."""
    from ddrl.acting import check_config as check_actors

    check_actors(cfg)
    placement_of(cfg).check_config(cfg)


def load_job(job: str | Path | None, overrides: list[str] = (),
             note: Callable[[str], None] | None = None) -> Config:
    """A job file and `--set` overrides as a config every floor has checked: the game
    (`ddrl.envs`), the keys (`ddrl.config`), the actors' and the placement's combinations
    (`check_config`)."""
    from ddrl.envs import check_env_id

    return load_config(job, overrides, check_env=check_env_id, note=note, checks=(check_config,))


def check_world(cfg: Config, world_size: int) -> None:
    placement_of(cfg).check(cfg, world_size)


def trainer_ranks(cfg: Config, world_size: int) -> int:
    return placement_of(cfg).trainer_ranks(cfg, world_size)
