"""n-step advantage actor-critic (A2C / BA3C): returns, loss, per-tensor gradient clipping."""
from __future__ import annotations

import numpy as np
import tensorflow as tf


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
                      returns: tf.Tensor, entropy_coef: float, value_coef: float
                      ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Policy gradient on stop_grad(R - V), value_coef x mean squared error, entropy bonus."""
    log_probs = tf.nn.log_softmax(logits)
    log_prob_a = tf.gather(log_probs, actions, batch_dims=1)
    advantage = returns - values
    policy_loss = -tf.reduce_mean(log_prob_a * tf.stop_gradient(advantage))
    value_loss = tf.reduce_mean(tf.square(advantage))
    entropy = -tf.reduce_mean(tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1))
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss,
                  "entropy": entropy}


def clip_by_average_norm(grad: tf.Tensor, clip: float) -> tf.Tensor:
    """TF1's clip_by_average_norm (removed in TF2), which the authors applied to every tensor."""
    avg_norm = tf.norm(grad) / tf.cast(tf.size(grad), grad.dtype)
    return grad * clip / tf.maximum(avg_norm, clip)
