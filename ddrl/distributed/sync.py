"""Gradient synchronisation: every backend turns each rank's flat gradient into one update.

All backends share one step: (flat gradient, side channel) -> update applied. The side
channel is a small float vector summed across ranks in the same collective (frames done,
stop requests, per-rank timings), so control decisions cost no extra round trip.
`Sync` is all the trainer knows of a backend; parameter-server mode (ddrl/distributed/ps*.py)
implements it on its worker ranks, and its server ranks run their own loop instead.

A backend never touches the learner: it returns an `Update` (a mean gradient, or weights and
Adam state computed elsewhere) and the trainer applies it, in one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ddrl.distributed.world import World

if TYPE_CHECKING:  # ddrl.optim brings TensorFlow, which check_world must not wait for
    from ddrl.optim import AdamMoments


@dataclass
class Update:
    """What the trainer applies to its learner after a sync: the mean of the contributors'
    gradients (every rank then runs the same Adam step), or the weights, and Adam's state
    when asked for, that the parameter servers computed. Nothing when a non-finite gradient
    was dropped. Arrays may be the backend's buffers: apply before the next sync call."""
    gradient: np.ndarray | None = None
    weights: np.ndarray | None = None
    moments: AdamMoments | None = None


@dataclass
class SyncResult:
    """`extras` sums the side channel of every rank's step since this rank's previous one.
    `contributors`, `dropped` and the mean `staleness` count the gradients applied and
    dropped in that interval. Per trainer rank, `reports` counts the steps summed into its
    part of `extras` and `applied` its gradients applied (None: one each, as in an
    all-reduce). `rows` is the backend's own telemetry for the run log: table -> rows.
    `finite` False: the summed gradient held NaN or Inf and no rank applies it."""
    extras: np.ndarray
    contributors: int
    seconds: float
    update: Update = field(default_factory=Update)
    dropped: int = 0
    staleness: float = 0.0
    reports: np.ndarray | None = None
    applied: np.ndarray | None = None
    rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    finite: bool = True


def mean_gradient(mean_grad: np.ndarray, extras: np.ndarray, ranks: int,
                  seconds: float) -> SyncResult:
    """One NaN or Inf on any rank makes the sum non-finite, so every rank sees the same sum
    and drops the same update: the weights and Adam state never take it in."""
    if not np.isfinite(mean_grad).all():
        return SyncResult(extras, 0, seconds, dropped=ranks, finite=False)
    return SyncResult(extras, ranks, seconds, Update(gradient=mean_grad))


class Sync(Protocol):
    """What the trainer loop needs of a backend, whichever it is."""

    name: str
    # The ranks that run the trainer loop, as one world of their own.
    world: World
    # Every trainer rank takes part in every update (all see the same side channel at once):
    # they can pause together.
    lockstep: bool

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        """Rank 0's array on every rank of the job."""

    def update(self, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        """Send this rank's gradient and side channel; the result's `update` makes the
        learner's next weights."""

    def pull_state(self) -> Update:
        """What makes the learner's weights and Adam state the current ones, before a
        checkpoint (nothing where they already are)."""

    def finish(self) -> SyncResult | None:
        """The last exchange, once this rank has left the update loop."""

    def close(self) -> None: ...


class TreeSum:
    """The sum of a process's virtual ranks' gradients, added in pairs as a tree: the order
    of a recursive-doubling all-reduce (Open MPI's for small gradients), so that k virtual
    ranks and k real ones round alike; O(log k) buffers. The first gradient is kept as given
    (one rank's array then reaches `Learner.apply` as its own)."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, np.ndarray]] = []  # (tree level, partial sum)

    def add(self, grad: np.ndarray) -> None:
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, left = self._stack.pop()
            grad = left + grad
            level += 1
        self._stack.append((level, grad))

    def total(self) -> np.ndarray:
        total = self._stack.pop()[1]
        while self._stack:  # k not a power of two: the smaller subtrees join from the right
            total = self._stack.pop()[1] + total
        return total


def bcast(comm, array: np.ndarray) -> np.ndarray:
    array = np.array(array, order="C")
    comm.Bcast(array, root=0)
    return array


class LocalSync:
    """One rank: the gradient is the update. A process that carries `virtual` ranks of a
    bigger job hands in their gradients' sum, and every all-reduce divides by the ranks of
    the job (`contributors`), as that job's own all-reduce would."""

    name = "none"
    lockstep = True

    def __init__(self, world: World, virtual: int = 1):
        self.world = world
        self.contributors = world.size * virtual

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return array

    def update(self, grad: np.ndarray, extras: np.ndarray) -> SyncResult:
        # One contributor: the very array (see Learner.apply), not a copy divided by 1.
        mean = grad if self.contributors == 1 else grad / self.contributors
        return mean_gradient(mean, extras, self.contributors, 0.0)

    def pull_state(self) -> Update:
        return Update()

    def finish(self) -> SyncResult | None:
        return None

    def close(self) -> None:
        pass
