"""A rank's actors: its simulators, the threads that choose their actions, and what turns their
steps into training batches (a FIFO of n-step segments, or a replay memory).

`ba3c.py` is the paper's node (asynchronous predictors feeding a FIFO), `a2c.py` its
synchronous variant, `dqn.py` DQN's samplers and replay memory (`replay.py`); `base.py` is
what the training loop needs of all of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ddrl.config import Config

if TYPE_CHECKING:  # both bring TensorFlow, which choosing a class must not wait for
    from ddrl.acting.base import Actors
    from ddrl.learner import Learner


def actors_class(cfg: Config) -> type:
    """The actors for `acting.mode`, imported only when chosen."""
    if cfg.acting.mode == "a2c":
        from ddrl.acting.a2c import A2CActors

        return A2CActors
    if cfg.acting.mode == "dqn":
        from ddrl.acting.dqn import DQNActors

        return DQNActors
    from ddrl.acting.ba3c import BA3CActors

    return BA3CActors


def make_actors(cfg: Config, learner: "Learner", rank: int, restart: int) -> "Actors":
    """Process `rank`'s actors: the rank's own, or with `sync.virtual_ranks` = k the k ranks
    rank x k ... rank x k + k - 1 of the job it rehearses."""
    cls, k = actors_class(cfg), cfg.sync.virtual_ranks
    if k == 1:
        return cls(cfg, learner, rank, restart)
    from ddrl.acting.virtual import VirtualRanks

    return VirtualRanks([cls(cfg, learner, rank * k + i, restart) for i in range(k)])
