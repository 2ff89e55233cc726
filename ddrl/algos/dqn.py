"""DQN (Mnih et al. 2015) with the extensions of Rainbow and R2D2 as options: n-step returns,
Double DQN's target, the dueling head, importance weights of prioritized replay, Categorical
DQN's distribution over fixed atoms (Bellemare et al. 2017) and R2D2's value rescaling. The
replay memory, the target network and the samplers belong to the dqn node
(`ddrl/acting/dqn.py`); this module owns the targets and the loss.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.actor_critic import nstep_returns
from ddrl.algos.base import NextValues, OneStep
from ddrl.algos.batch import Batch
from ddrl.config import Config

# R2D2's epsilon in h: keeps h^-1 Lipschitz, so errors of the bootstrap stay bounded.
RESCALE_EPS = 1e-3


def bootstrap_values(q_target: np.ndarray, q_online: np.ndarray, double: bool) -> np.ndarray:
    """The value of the state after the n steps: max_a Q_target (DQN), or Q_target at the online
    network's argmax (Double DQN), which removes max's overestimation bias."""
    return np.take_along_axis(q_target, greedy(q_target, q_online, double)[:, None], -1)[:, 0]


def greedy(q_target: np.ndarray, q_online: np.ndarray, double: bool) -> np.ndarray:
    """The action the bootstrap takes: the online network's argmax (Double DQN) or the
    target network's."""
    return (q_online if double else q_target).argmax(-1)


def rescale(x: np.ndarray) -> np.ndarray:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x: squashes returns of any scale, so games'
    unclipped rewards share one network and learning rate (R2D2, Pohlen et al. 2018)."""
    return np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + RESCALE_EPS * x


def unrescale(y: np.ndarray) -> np.ndarray:
    """h^-1, in closed form (Pohlen et al. 2018, proposition A.2), its (sqrt(1 + 4eu) - 1) / 2e
    written as 2u / (sqrt(1 + 4eu) + 1): the same number without the cancellation that costs
    float32 four digits at e = 1e-3."""
    e = RESCALE_EPS
    u = np.abs(y) + 1 + e
    root = 2 * u / (np.sqrt(1 + 4 * e * u) + 1)
    return np.sign(y) * (np.square(root) - 1)


def project(probs: np.ndarray, shifted: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Categorical DQN's projection: the distribution with mass probs[b, j] at shifted[b, j]
    (the Bellman-updated atoms) spread onto the fixed `support`, each mass split between the
    two atoms either side of it in proportion to closeness; atoms beyond the support's ends
    are clipped onto them."""
    v_min, v_max, k = support[0], support[-1], len(support)
    position = (np.clip(shifted, v_min, v_max) - v_min) / ((v_max - v_min) / (k - 1))
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, k - 1)
    upper = position - low
    out = np.zeros_like(probs)
    rows = np.broadcast_to(np.arange(len(probs))[:, None], low.shape)
    # A mass exactly on an atom (upper == 0) lands whole on `low`.
    np.add.at(out, (rows, low), probs * (1 - upper))
    np.add.at(out, (rows, high), probs * upper)
    return out


def huber(x: tf.Tensor) -> tf.Tensor:
    """The squared error with its gradient clipped to [-1, 1] (Nature DQN's error clipping)."""
    a = tf.abs(x)
    return tf.where(a <= 1.0, 0.5 * tf.square(x), a - 0.5)


def epsilon(cfg: Config, step: int) -> float:
    """The exploration rate after `step` agent steps of learning, annealed linearly."""
    a = cfg.dqn
    return a.eps_final + (a.eps_start - a.eps_final) * max(0.0, 1.0 - step / a.eps_steps)


class DQN(OneStep):
    """Regression of Q(s, a) on n-step returns bootstrapped with the target network, or with
    dqn.atoms > 1 the cross-entropy of Z(s, a) against the projected n-step distribution.
    Each data point's loss is weighted by its importance weight (1 for uniform replay); the
    per-point |TD error| (scalar) or cross-entropy (categorical) leaves as `per_sample` for
    the priorities."""

    name = "dqn"

    def __init__(self, cfg: Config):
        a = cfg.dqn
        self.gamma, self.double, self.rescale = cfg.algo.gamma, a.double, a.value_rescale
        self.categorical = a.atoms > 1
        self.head = ("dueling" if a.dueling else "q") + ("_categorical" if self.categorical else "")
        self.support = (np.linspace(a.v_min, a.v_max, a.atoms, dtype=np.float32)
                        if self.categorical else None)
        self.fields = ("distribution" if self.categorical else "returns", "weights")
        self.target_shapes = {"distribution": (a.atoms,)} if self.categorical else {}

    def state_value(self, q: np.ndarray) -> np.ndarray:
        v = q.max(-1)
        return unrescale(v) if self.rescale else v

    def replay_batch(self, sample, values: NextValues) -> Batch:
        """`sample`: B transitions (obs, actions, acted_at, importance weights) with the n
        rewards and dones after each and the observations n steps on."""
        target_out, q_online = values(sample.next_obs)
        targets = self.replay_targets(sample.rewards, sample.dones, target_out, q_online)
        return Batch(sample.obs, sample.actions, sample.acted_at,
                     {**targets, "weights": sample.weights})

    def replay_targets(self, rewards: np.ndarray, dones: np.ndarray,
                       target_out: tuple[np.ndarray, np.ndarray],
                       online_q: np.ndarray) -> dict[str, np.ndarray]:
        """(n, B) rewards and dones of B sampled transitions and the n after them; the target
        network's outputs and the online network's Q on the observations n steps on."""
        q_target, second = target_out
        if self.categorical:
            # n-step returns are linear in the bootstrap: R + discount * z, with R the return
            # bootstrapped with 0 and the discount (gamma^n, or 0 after a done) the "return" of
            # zero rewards bootstrapped with 1.
            reward = nstep_returns(rewards, dones, np.zeros(rewards.shape[1], np.float32),
                                   self.gamma)[0]
            discount = nstep_returns(np.zeros_like(rewards), dones,
                                     np.ones(rewards.shape[1], np.float32), self.gamma)[0]
            action = greedy(q_target, online_q, self.double)
            probs = np.exp(np.take_along_axis(second, action[:, None, None], 1)[:, 0])
            shifted = reward[:, None] + discount[:, None] * self.support[None, :]
            return {"distribution": project(probs, shifted, self.support)}
        bootstrap = bootstrap_values(q_target, online_q, self.double)
        if self.rescale:
            bootstrap = unrescale(bootstrap)
        returns = nstep_returns(rewards, dones, bootstrap, self.gamma)[0]
        return {"returns": rescale(returns) if self.rescale else returns}

    def loss(self, logits, values, actions, targets):
        """`logits` are the Q-values; `values` the log-probabilities over atoms (B, A, K)
        with a categorical head (see `ddrl.models.build_model`)."""
        if self.categorical:
            log_p = tf.gather(values, actions, batch_dims=1)
            per_sample = -tf.reduce_sum(targets["distribution"] * log_p, axis=-1)
            point_loss = per_sample
        else:
            error = tf.gather(logits, actions, batch_dims=1) - targets["returns"]
            per_sample, point_loss = tf.abs(error), huber(error)
        loss = tf.reduce_mean(targets["weights"] * point_loss)
        nan = tf.constant(float("nan"))
        return loss, {"loss": loss, "policy_loss": nan, "value_loss": loss,
                      "entropy": nan, "approx_kl": nan, "clip_frac": nan,
                      "per_sample": per_sample}

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        return [batch]
