"""DQN (Mnih et al. 2015) with the usual extensions as options: n-step returns, Double DQN's
target, the dueling head. The replay memory, the target network and the samplers belong to
the dqn node (`ddrl/acting/dqn.py`); this module owns the targets and the loss.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.actor_critic import nstep_returns
from ddrl.algos.batch import Batch, Rollout
from ddrl.config import Config


def bootstrap_values(q_target: np.ndarray, q_online: np.ndarray, double: bool) -> np.ndarray:
    """The value of the state after the n steps: max_a Q_target (DQN), or Q_target at the online
    network's argmax (Double DQN), which removes max's overestimation bias."""
    if double:
        return np.take_along_axis(q_target, q_online.argmax(-1)[:, None], -1)[:, 0]
    return q_target.max(-1)


def huber(x: tf.Tensor) -> tf.Tensor:
    """The squared error with its gradient clipped to [-1, 1] (Nature DQN's error clipping)."""
    a = tf.abs(x)
    return tf.where(a <= 1.0, 0.5 * tf.square(x), a - 0.5)


def epsilon(cfg: Config, step: int) -> float:
    """The exploration rate after `step` agent steps of learning, annealed linearly."""
    a = cfg.dqn
    return a.eps_final + (a.eps_start - a.eps_final) * max(0.0, 1.0 - step / a.eps_steps)


class DQN:
    """Regression of Q(s, a) on n-step returns bootstrapped with the target network."""

    name = "dqn"
    fields = ("returns",)
    off_policy = False

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.head = "dueling" if cfg.dqn.dueling else "q"

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        """(n, B) rewards and dones of B sampled transitions and the n after them; `bootstrap`
        values the state n steps on. The return of each time step, to its last step: row 0 is
        the n-step target of the sampled transitions."""
        return {"returns": nstep_returns(rollout.rewards, rollout.dones, rollout.bootstrap,
                                         self.cfg.algo.gamma)}

    def loss(self, logits, values, actions, targets):
        q = tf.gather(logits, actions, batch_dims=1)
        loss = tf.reduce_mean(huber(q - targets["returns"]))
        nan = tf.constant(float("nan"))
        return loss, {"loss": loss, "policy_loss": nan, "value_loss": loss,
                      "entropy": nan, "approx_kl": nan, "clip_frac": nan}

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        return [batch]
