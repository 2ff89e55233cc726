"""What an algorithm owns: its targets, its loss, its minibatches.

Two families, two protocols. A rollout algorithm (A2C, PPO, V-trace, APPO) takes its targets
from a time-major rollout the actors just played; a replay algorithm (DQN and its Rainbow
parts, R2D2) from transitions or sequences drawn from a replay memory, bootstrapped with the
networks the actors hold. The learner is generic over `Algorithm`, what both share; the
`/train` columns are `STAT_NAMES`, which every algorithm fills (NaN where a figure means
nothing to it).
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import tensorflow as tf

from ddrl.algos.batch import Batch, Rollout
from ddrl.config import Config

STAT_NAMES = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm", "approx_kl",
              "clip_frac")


class Algorithm(Protocol):
    """What the learner needs of either family."""

    name: str
    # The Batch.targets fields its loss takes, in the order the learner passes them.
    fields: tuple[str, ...]
    # Each field's shape per data point where it is not one number (a distribution).
    target_shapes: dict[str, tuple[int, ...]]
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

    def loss(self, logits: tf.Tensor, values: tf.Tensor, actions: tf.Tensor,
             targets: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """The scalar to minimise and the statistics named in STAT_NAMES (grad_norm aside);
        optionally `per_sample`, a figure per data point that `Learner.gradients` returns
        beside the gradient (prioritized replay's TD errors)."""

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        """The gradient steps one batch makes, in order."""


class RolloutAlgorithm(Algorithm, Protocol):
    # True: the targets correct for the lag between the acting and the learning policy, so
    # the actors hand them the learner's current policy and values on the rollout
    # (V-trace); False: the actor's values serve.
    off_policy: bool

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        """Per-step (T, N) targets of one rollout."""


# The networks a replay algorithm bootstraps with, on a sample's observations: the target
# network's outputs, and the Q whose argmax picks the bootstrap's action (the online
# network's under Double DQN, else the target's).
NextValues = Callable[..., tuple[tuple[np.ndarray, ...], np.ndarray]]


class ReplayAlgorithm(Algorithm, Protocol):
    def replay_batch(self, sample, values: NextValues) -> Batch:
        """The minibatch of a sample drawn from the replay memory, targets computed: the
        n-step returns (or their distribution) bootstrapped with `values`."""

    def state_value(self, q: np.ndarray) -> np.ndarray:
        """max_a Q in reward units (what a time-limit cut bootstraps with)."""


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
