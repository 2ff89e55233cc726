"""A rollout as the algorithm sees it, and a batch of data points: what the trainer computes
one gradient on."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Batch:
    obs: np.ndarray
    actions: np.ndarray
    # The update count when each action was chosen: the trainer measures policy lag from it.
    acted_at: np.ndarray
    # Per data point, what the algorithm's loss takes besides obs and actions (by field name).
    targets: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.actions)

    def take(self, index: np.ndarray | slice) -> "Batch":
        return Batch(self.obs[index], self.actions[index], self.acted_at[index],
                     {k: v[index] for k, v in self.targets.items()})


@dataclass
class Rollout:
    """(T, N) time-major arrays of N simulators' steps; `bootstrap` (N,) values the state after
    the last step. `values` and `bootstrap` are the critic's: the actor's for on-policy
    algorithms, the learner's current ones for off-policy ones (`RolloutAlgorithm.off_policy`)."""

    rewards: np.ndarray
    dones: np.ndarray
    values: np.ndarray
    # log pi(a) of the policy that acted (the behaviour policy).
    logp: np.ndarray
    bootstrap: np.ndarray
    # log pi(a) of the learner's current policy; None where the two are the same.
    target_logp: np.ndarray | None = None
