"""n-step advantage actor-critic (A2C / BA3C): returns, loss, per-tensor gradient clipping."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.base import ActorCritic, approx_kl, policy_terms
from ddrl.algos.batch import Batch, Rollout


def nstep_returns(rewards: np.ndarray, dones: np.ndarray, bootstrap: np.ndarray | float,
                  gamma: float) -> np.ndarray:
    """Discounted returns over the time axis 0, cut at `dones`, bootstrapped after the last step."""
    returns = np.empty_like(rewards, dtype=np.float32)
    running = np.asarray(bootstrap, dtype=np.float32)
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    return returns


def actor_critic_loss(logits: tf.Tensor, values: tf.Tensor, actions: tf.Tensor,
                      returns: tf.Tensor, entropy_coef: float, value_coef: float,
                      advantages: tf.Tensor | None = None,
                      behaviour_logp: tf.Tensor | None = None
                      ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Policy gradient on the advantages (stop_grad(R - V) unless given), value_coef x mean
    squared error of V against R, entropy bonus. Given the acting policy's log-probabilities,
    `approx_kl` is how far the current policy has moved from it (NaN otherwise)."""
    log_prob_a, entropy = policy_terms(logits, actions)
    error = returns - values
    advantages = error if advantages is None else advantages
    policy_loss = -tf.reduce_mean(log_prob_a * tf.stop_gradient(advantages))
    value_loss = tf.reduce_mean(tf.square(error))
    entropy = tf.reduce_mean(entropy)
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    nan = tf.constant(float("nan"))
    kl = nan if behaviour_logp is None else approx_kl(log_prob_a - behaviour_logp)
    return loss, {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss,
                  "entropy": entropy, "approx_kl": kl, "clip_frac": nan}


def clip_by_average_norm(grad: tf.Tensor, clip: float) -> tf.Tensor:
    """TF1's clip_by_average_norm (removed in TF2), which the authors applied to every tensor."""
    avg_norm = tf.norm(grad) / tf.cast(tf.size(grad), grad.dtype)
    return grad * clip / tf.maximum(avg_norm, clip)


class A2C(ActorCritic):
    """One gradient step per batch, on n-step returns; the advantage uses the current critic."""

    name = "a2c"
    fields = ("returns",)
    off_policy = False

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        return {"returns": nstep_returns(rollout.rewards, rollout.dones, rollout.bootstrap,
                                         self.cfg.algo.gamma)}

    def loss(self, logits, values, actions, targets):
        a = self.cfg.algo
        return actor_critic_loss(logits, values, actions, targets["returns"], a.entropy,
                                 a.value_coef)

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        return [batch]
