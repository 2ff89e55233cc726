"""PPO (Schulman et al. 2017): clipped surrogate on GAE advantages, epochs x minibatches.

Across ranks every minibatch gradient goes through the sync backend like any other update,
so N ranks train one agent on N times the data (as DD-PPO does).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.base import ActorCritic, approx_kl, policy_terms
from ddrl.algos.batch import Batch, Rollout


def gae(rewards: np.ndarray, dones: np.ndarray, values: np.ndarray, bootstrap: np.ndarray,
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) over the time axis 0; `dones[t]` ends the chain after step t."""
    advantages = np.empty_like(rewards, dtype=np.float32)
    running = np.zeros_like(np.asarray(bootstrap), dtype=np.float32)
    next_value = np.asarray(bootstrap, dtype=np.float32)
    for t in range(len(rewards) - 1, -1, -1):
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        advantages[t] = running
        next_value = values[t]
    return advantages, (advantages + values).astype(np.float32)


def standardized(adv: np.ndarray) -> np.ndarray:
    """Advantages to mean 0, deviation 1, as the loss's per-minibatch normalisation does."""
    return ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)


def ppo_loss(logits: tf.Tensor, values: tf.Tensor, actions: tf.Tensor,
             targets: dict[str, tf.Tensor], clip: float, clip_value: bool,
             normalize: bool, entropy_coef: float, value_coef: float
             ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    log_prob_a, entropy = policy_terms(logits, actions)
    adv = targets["advantages"]
    if normalize:
        mean, var = tf.nn.moments(adv, axes=[0])
        adv = (adv - mean) / (tf.sqrt(var) + 1e-8)
    log_ratio = log_prob_a - targets["logp"]
    ratio = tf.exp(log_ratio)
    surrogate = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1 - clip, 1 + clip) * adv)
    policy_loss = -tf.reduce_mean(surrogate)
    returns, old_values = targets["returns"], targets["values"]
    value_err = tf.square(values - returns)
    if clip_value:
        clipped = old_values + tf.clip_by_value(values - old_values, -clip, clip)
        value_err = tf.maximum(value_err, tf.square(clipped - returns))
    value_loss = tf.reduce_mean(value_err)
    entropy = tf.reduce_mean(entropy)
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    clip_frac = tf.reduce_mean(tf.cast(tf.abs(ratio - 1) > clip, tf.float32))
    return loss, {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss,
                  "entropy": entropy, "approx_kl": approx_kl(log_ratio), "clip_frac": clip_frac}


class PPO(ActorCritic):
    name = "ppo"
    fields = ("returns", "advantages", "logp", "values")
    off_policy = False

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        r = rollout
        adv, returns = gae(r.rewards, r.dones, r.values, r.bootstrap, self.cfg.algo.gamma,
                           self.cfg.algo.gae_lambda)
        return {"returns": returns, "advantages": self._normalized(adv),
                "logp": r.logp.astype(np.float32), "values": r.values.astype(np.float32)}

    def _normalized(self, adv: np.ndarray) -> np.ndarray:
        # Over a rank's rollout, the statistics do not shrink with the minibatch: at a large
        # global batch a rank's share of a minibatch can be a handful of samples.
        a = self.cfg.algo
        return standardized(adv) if a.normalize and a.normalize_over == "rollout" else adv

    def loss(self, logits, values, actions, targets):
        a = self.cfg.algo
        per_minibatch = a.normalize and a.normalize_over == "minibatch"
        return ppo_loss(logits, values, actions, targets, a.ratio_clip, a.clip_value,
                        per_minibatch, a.entropy, a.value_coef)

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        out = []
        for _ in range(self.cfg.algo.epochs):
            for index in np.array_split(rng.permutation(len(batch)), self.cfg.algo.minibatches):
                out.append(batch.take(np.sort(index)))
        return out
