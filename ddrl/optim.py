"""Adam with the paper's tuned constants (or Nature DQN's centered RMSProp), and learning-rate
scaling rules for many workers."""
from __future__ import annotations

import math

import tensorflow as tf

from ddrl.config import OptimConfig


def scaled_lr(cfg: OptimConfig, workers: int) -> float:
    """The paper found linear scaling unstable for Adam (so `none` is the default);
    the accelerated-methods paper found sqrt(batch) scaling best for large-batch A2C."""
    factor = {"none": 1.0, "sqrt": math.sqrt(workers), "linear": float(workers)}[cfg.lr_scaling]
    return cfg.lr * factor


def scheduled_lr(cfg: OptimConfig, base: float, progress: float) -> float:
    """`linear` anneals to 0 at the end of the run (PPO's usual schedule)."""
    if cfg.lr_schedule == "linear":
        return base * max(1.0 - progress, 0.0)
    return base


def make_optimizer(cfg: OptimConfig, workers: int) -> tf.keras.optimizers.Optimizer:
    if cfg.optimizer == "rmsprop":
        # Keras adds epsilon under the square root, as DeepMind's DQN did (eps 0.01 there).
        return tf.keras.optimizers.RMSprop(learning_rate=scaled_lr(cfg, workers), rho=cfg.beta2,
                                           momentum=0.0, epsilon=cfg.eps, centered=True)
    # Keras' epsilon is TF1's "epsilon hat" (added to sqrt(v_hat)), as in the authors' TF 1.2 code.
    return tf.keras.optimizers.Adam(learning_rate=scaled_lr(cfg, workers), beta_1=cfg.beta1,
                                    beta_2=cfg.beta2, epsilon=cfg.eps)
