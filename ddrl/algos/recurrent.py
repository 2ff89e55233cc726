"""An actor-critic algorithm (A2C, PPO, V-trace, APPO) on a recurrent network
(`algo.recurrent` > 0): an LSTM between the torso and the actor-critic head, as R2D2 has before
its Q head, for games whose state one frame stack does not show.

A sequence of `acting.t_max` steps is one data point (a simulator's rollout on the a2c node, a
segment on the ba3c node): its observations (T, ...), actions and targets (T,), the game starts
(T,) and the LSTM state the simulator acted from at its first step (2, units). The learner
unrolls the network over the sequence from that state, so it sees what the actor saw (PPO's
first minibatch has ratio 1); its minibatches are sets of sequences. The targets and the loss
are the wrapped algorithm's, on the (B x T) steps.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.base import RolloutAlgorithm
from ddrl.algos.batch import Batch, Rollout
from ddrl.config import Config


class OverSequences:
    def __init__(self, cfg: Config, inner: RolloutAlgorithm):
        t, units = cfg.acting.t_max, cfg.algo.recurrent
        self.inner = inner
        self.name, self.off_policy, self.head = inner.name, inner.off_policy, inner.head
        self.support = None
        self.recurrent = units
        self.sequence = t
        self.action_shape = (t,)
        self.fields = (*inner.fields, "starts", "state")
        self.target_shapes = {**{f: (t,) for f in inner.fields}, "starts": (t,),
                              "state": (2, units)}

    def forward(self, model, obs, targets, training: bool):
        state = targets["state"]
        logits, values, _, _ = model([obs, targets["starts"], state[:, 0], state[:, 1]],
                                     training=training)
        return logits, values

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        return self.inner.targets(rollout)

    def loss(self, logits, values, actions, targets):
        def steps(x: tf.Tensor) -> tf.Tensor:
            return tf.reshape(x, [-1, *x.shape[2:]])

        return self.inner.loss(steps(logits), steps(values), steps(actions),
                               {f: steps(targets[f]) for f in self.inner.fields})

    def minibatches(self, batch: Batch, rng: np.random.Generator) -> list[Batch]:
        return self.inner.minibatches(batch, rng)
