"""Learning algorithms: one module each, behind the interface in `base`."""
from __future__ import annotations

from ddrl.algos.base import STAT_NAMES, Algorithm, ReplayAlgorithm, RolloutAlgorithm
from ddrl.config import Config

__all__ = ["STAT_NAMES", "Algorithm", "ReplayAlgorithm", "RolloutAlgorithm", "make_algorithm"]


def make_algorithm(cfg: Config) -> RolloutAlgorithm | ReplayAlgorithm:
    from ddrl.algos.actor_critic import A2C
    from ddrl.algos.dqn import DQN
    from ddrl.algos.ppo import PPO
    from ddrl.algos.r2d2 import R2D2
    from ddrl.algos.recurrent import OverSequences
    from ddrl.algos.vtrace import APPO, VTrace

    if cfg.algo.name == "dqn" and cfg.dqn.recurrent:
        return R2D2(cfg)
    algo = {"a2c": A2C, "ppo": PPO, "vtrace": VTrace, "appo": APPO, "dqn": DQN}[cfg.algo.name](cfg)
    return OverSequences(cfg, algo) if cfg.algo.recurrent else algo
