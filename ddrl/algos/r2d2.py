"""R2D2 (Kapturowski et al. 2019): DQN's targets and loss over replayed sequences of a recurrent
Q network. Each sequence starts from the recurrent state its actor had (stored with it), runs
`burn_in` steps that only refresh that state, then learns on the next `sequence` steps; the
n-step targets of those steps come from unrolls of the target and online networks over the
same sequence and `n` steps more. The memory of sequences belongs to the dqn node
(`ddrl/acting/sequences.py`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.algos.actor_critic import nstep_returns
from ddrl.algos.base import NextValues
from ddrl.algos.batch import Batch
from ddrl.algos.dqn import DQN, bootstrap_values, huber, rescale, unrescale
from ddrl.config import Config


def sequence_priority(errors: np.ndarray | tf.Tensor, eta: float):
    """A sequence's priority from its steps' |TD errors| (B, T): eta max + (1 - eta) mean.
    The mean alone washes out one large error in a long sequence; the max alone is noisy."""
    errors = abs(errors)
    if isinstance(errors, np.ndarray):
        return eta * errors.max(-1) + (1 - eta) * errors.mean(-1)
    return eta * tf.reduce_max(errors, -1) + (1 - eta) * tf.reduce_mean(errors, -1)


class R2D2(DQN):
    """Per data point: a sequence of burn_in + sequence observations (B, T, ...), the actions
    of the learned steps (B, sequence), their n-step returns, the game starts (B, T) and the
    stored state (B, 2, units): the loss is Huber's on the learned steps, averaged over them,
    weighted per sequence."""

    name = "r2d2"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        a = cfg.dqn
        self.recurrent, self.burn_in, self.length = a.recurrent, a.burn_in, a.sequence
        self.n, self.eta = a.n_step, a.priority_eta
        self.sequence = a.burn_in + a.sequence
        self.action_shape = (a.sequence,)
        self.fields = ("returns", "weights", "starts", "state")
        self.target_shapes = {"returns": (a.sequence,), "starts": (self.sequence,),
                              "state": (2, a.recurrent)}

    def forward(self, model, obs, targets, training: bool):
        """Burn-in from the stored state without gradient, then the learned steps."""
        h, c = targets["state"][:, 0], targets["state"][:, 1]
        starts = targets["starts"]
        b = self.burn_in
        if b:
            _, _, h, c = model([obs[:, :b], starts[:, :b], h, c], training=training)
            h, c = tf.stop_gradient(h), tf.stop_gradient(c)
        q, q_max, _, _ = model([obs[:, b:], starts[:, b:], h, c], training=training)
        return q, q_max

    def replay_batch(self, sample, values: NextValues) -> Batch:
        """`sample`: B sequences of burn-in + sequence + n steps, each from its stored state.
        Both networks unroll over the whole sequence for the targets; the learner gets the
        burn-in and learned steps."""
        target_out, q_online = values(sample.obs, sample.starts, sample.state[:, 0],
                                      sample.state[:, 1])
        targets = self.sequence_targets(sample.rewards, sample.dones, target_out[0], q_online)
        steps = self.sequence
        return Batch(sample.obs[:, :steps], sample.actions[:, self.burn_in:steps],
                     sample.acted_at, {**targets, "weights": sample.weights,
                                       "starts": sample.starts[:, :steps], "state": sample.state})

    def sequence_targets(self, rewards: np.ndarray, dones: np.ndarray, q_target: np.ndarray,
                         q_online: np.ndarray) -> dict[str, np.ndarray]:
        """(B, burn_in + sequence + n) rewards and dones of B sequences and the two networks'
        Q-values unrolled over them: each learned step's n-step return, bootstrapped n steps
        on (within the sequence), rescaled where dqn.value_rescale is on."""
        b, length, n = self.burn_in, self.length, self.n
        steps = b + np.arange(length)[:, None] + np.arange(n)[None, :]   # (L, n)
        # (n, B x L): the n rewards and dones after each learned step, time first.
        r = rewards[:, steps].transpose(2, 0, 1).reshape(n, -1)
        d = dones[:, steps].transpose(2, 0, 1).reshape(n, -1)
        actions = q_target.shape[-1]
        later = slice(b + n, b + n + length)
        bootstrap = bootstrap_values(q_target[:, later].reshape(-1, actions),
                                     q_online[:, later].reshape(-1, actions), self.double)
        if self.rescale:
            bootstrap = unrescale(bootstrap)
        returns = nstep_returns(r, d, bootstrap, self.gamma)[0]
        if self.rescale:
            returns = rescale(returns)
        return {"returns": returns.reshape(len(rewards), length)}

    def loss(self, logits, values, actions, targets):
        error = tf.gather(logits, actions, batch_dims=2) - targets["returns"]
        loss = tf.reduce_mean(targets["weights"] * tf.reduce_mean(huber(error), -1))
        nan = tf.constant(float("nan"))
        return loss, {"loss": loss, "policy_loss": nan, "value_loss": loss,
                      "entropy": nan, "approx_kl": nan, "clip_frac": nan,
                      "per_sample": sequence_priority(error, self.eta)}
