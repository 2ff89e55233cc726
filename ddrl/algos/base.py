"""What an algorithm owns: its targets on time-major rollouts, its loss, its minibatches.

The learner and the nodes are generic over this interface; the `/train` columns are
`STAT_NAMES`, which every algorithm fills (NaN where a figure means nothing to it).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf

from ddrl.algos.batch import Batch, Rollout
from ddrl.config import Config

STAT_NAMES = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm", "approx_kl",
              "clip_frac")


class Algorithm(Protocol):
    name: str
    # The Batch.targets fields its loss takes, in the order the learner passes them.
    fields: tuple[str, ...]
    # Each field's shape per data point where it is not one number (a distribution).
    target_shapes: dict[str, tuple[int, ...]]
    # True: the targets correct for the lag between the acting and the learning policy, so
    # the node hands them the learner's current policy and values on the rollout (V-trace);
    # False: the actor's values serve.
    off_policy: bool
    # The network's outputs: "actor_critic" (policy logits, value) or a Q head ("q",
    # "dueling", each also "_categorical"); see `ddrl.models.build_model`.
    head: str
    # The atoms of a categorical head's distribution; None for every other head.
    support: np.ndarray | None

    # Observations per data point: 0 for one, T for a sequence of T (B, T, ...), whose
    # actions are `action_shape` per data point ((T,) of them; () for one).
    sequence: int
    action_shape: tuple[int, ...]
    # The LSTM's units of a recurrent network (R2D2, `algo.recurrent`); 0 for a feed-forward one.
    recurrent: int

    def forward(self, model, obs: tf.Tensor, targets: dict[str, tf.Tensor], training: bool
                ) -> tuple[tf.Tensor, tf.Tensor]:
        """The network's two outputs on a minibatch's observations (a recurrent network:
        unrolled from the state the targets carry)."""

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        """Per-step (T, N) targets of one rollout (the actor-critic algorithms; DQN's come
        from replayed transitions, `DQN.replay_targets`)."""

    def loss(self, logits: tf.Tensor, values: tf.Tensor, actions: tf.Tensor,
             targets: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """The scalar to minimise and the statistics named in STAT_NAMES (grad_norm aside);
        optionally `per_sample`, a figure per data point the node reads back from
        `Learner.per_sample` (prioritized replay's TD errors)."""

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        """The gradient steps one rollout makes, in order."""


class OneStep:
    """What every algorithm whose data points are single observations shares."""

    sequence = 0
    action_shape: tuple[int, ...] = ()
    recurrent = 0

    def forward(self, model, obs, targets, training: bool):
        return model(obs, training=training)


class ActorCritic(OneStep):
    """What the algorithms on the policy-and-value head share: scalar targets, no atoms."""

    head = "actor_critic"
    support = None
    target_shapes: dict[str, tuple[int, ...]] = {}

    def __init__(self, cfg: Config):
        self.cfg = cfg


def policy_terms(logits: tf.Tensor, actions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """log pi(a) of the taken actions and the policy's entropy per data point."""
    log_probs = tf.nn.log_softmax(logits)
    entropy = -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1)
    return tf.gather(log_probs, actions, batch_dims=1), entropy


def log_prob(logits: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log pi(a) in numpy, for what the actor records at sampling time."""
    z = logits - logits.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return np.take_along_axis(log_probs, actions[:, None].astype(np.int64), axis=-1)[:, 0]


def approx_kl(log_ratio: tf.Tensor) -> tf.Tensor:
    """KL(behaviour || current) by the low-variance estimator (r - 1) - log r on the behaviour's
    samples, as CleanRL and SB3 log it."""
    return tf.reduce_mean(tf.exp(log_ratio) - 1 - log_ratio)
