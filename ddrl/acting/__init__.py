"""A rank's actors: its simulators, the threads that choose their actions, and what turns their
steps into training batches (a FIFO of n-step segments, or a replay memory).

`ba3c.py` is the paper's node (asynchronous predictors feeding a FIFO), `a2c.py` its
synchronous variant, `dqn.py` DQN's samplers and replay memory (`replay.py`); `base.py` is
what the training loop needs of all of them.
"""
from __future__ import annotations

from ddrl.config import Config


def actors_class(cfg: Config) -> type:
    """The actors for `node.mode`, imported only when chosen."""
    if cfg.node.mode == "a2c":
        from ddrl.acting.a2c import A2CActors

        return A2CActors
    if cfg.node.mode == "dqn":
        from ddrl.acting.dqn import DQNActors

        return DQNActors
    from ddrl.acting.ba3c import BA3CActors

    return BA3CActors
