"""V-trace (Espeholt et al. 2018, IMPALA; SEED RL): off-policy corrected targets for the lag
between the policy that acted and the one that learns, and the two losses built on them.

`vtrace` is the actor-critic of the IMPALA paper on V-trace targets; `appo` is PPO's clipped
loss on V-trace targets (asynchronous PPO, as Sample Factory trains it). Both need the
learner's current policy and values on the rollout, which the node computes just before the
update (`off_policy`), one extra forward pass per batch.
"""
from __future__ import annotations

import numpy as np

from ddrl.algos.actor_critic import actor_critic_loss
from ddrl.algos.base import ActorCritic
from ddrl.algos.batch import Rollout
from ddrl.algos.ppo import PPO
from ddrl.config import Config


def vtrace(rewards: np.ndarray, dones: np.ndarray, values: np.ndarray, bootstrap: np.ndarray,
           behaviour_logp: np.ndarray, target_logp: np.ndarray, gamma: float,
           rho_clip: float, c_clip: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(v_s, q_s, rho_s) over the time axis 0; `dones[t]` ends the chain after step t.

    v_s = V(x_s) + sum_t gamma^(t-s) (c_s ... c_(t-1)) rho_t (r_t + gamma V(x_t+1) - V(x_t)),
    q_s = r_s + gamma v_(s+1) is the return the policy gradient weighs by rho_s, with
    rho = min(rho_clip, pi/mu) and c = min(c_clip, pi/mu).
    """
    ratio = np.exp(target_logp - behaviour_logp)
    rho = np.minimum(rho_clip, ratio)
    c = np.minimum(c_clip, ratio)
    live = 1.0 - dones
    next_values = np.concatenate([values[1:], bootstrap[None]])
    delta = rho * (rewards + gamma * live * next_values - values)
    correction = np.empty_like(delta, dtype=np.float32)
    running = np.zeros_like(bootstrap, dtype=np.float32)
    for t in range(len(rewards) - 1, -1, -1):
        running = delta[t] + gamma * live[t] * c[t] * running
        correction[t] = running
    vs = values + correction
    q = rewards + gamma * live * np.concatenate([vs[1:], bootstrap[None]])
    return vs.astype(np.float32), q.astype(np.float32), rho.astype(np.float32)


def _vtrace(cfg: Config, r: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    target = r.logp if r.target_logp is None else r.target_logp
    return vtrace(r.rewards, r.dones, r.values, r.bootstrap, r.logp, target, cfg.algo.gamma,
                  cfg.algo.rho_clip, cfg.algo.c_clip)


class VTrace(ActorCritic):
    """One gradient step per batch: the policy gradient weighs rho_s (q_s - V(x_s)), the
    critic regresses on v_s. Its `approx_kl` is how far the learner's policy has moved from
    the acting one on the batch: the policy lag in the policy's own terms. (The share of
    weights rho-bar = 1 truncates says little: about half of them at any lag.)"""

    name = "vtrace"
    fields = ("returns", "advantages", "logp")
    off_policy = True

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        vs, q, rho = _vtrace(self.cfg, rollout)
        return {"returns": vs, "advantages": rho * (q - rollout.values),
                "logp": rollout.logp.astype(np.float32)}

    def loss(self, logits, values, actions, targets):
        a = self.cfg.algo
        return actor_critic_loss(logits, values, actions, targets["returns"], a.entropy,
                                 a.value_coef, advantages=targets["advantages"],
                                 behaviour_logp=targets["logp"])

    def minibatches(self, batch, rng):
        return [batch]


class APPO(PPO):
    """PPO's epochs and clipped ratio pi / mu against the acting policy, on V-trace targets:
    the advantages are q_s - V(x_s) (the ratio already weighs them), the critic regresses on
    v_s."""

    name = "appo"
    off_policy = True

    def targets(self, rollout: Rollout) -> dict[str, np.ndarray]:
        vs, q, _ = _vtrace(self.cfg, rollout)
        return {"returns": vs, "advantages": self._normalized(q - rollout.values),
                "logp": rollout.logp.astype(np.float32),
                "values": rollout.values.astype(np.float32)}
