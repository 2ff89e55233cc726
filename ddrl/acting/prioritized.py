"""Proportional prioritized replay (Schaul et al. 2016) over the frame-once memory.

Every slot of the memory has a leaf in a sum tree; a transition's leaf holds priority^alpha
while it can be sampled (acted, its stack and its n following steps held) and 0 otherwise,
so sampling in proportion to the leaves never draws what the uniform sampler would reject.
Validity only changes at a stream's two ends as it advances (the oldest transitions lose
their frames, the newest gain their n-th successor), so each step updates a few leaves.
New transitions enter with the largest priority yet seen, so each is replayed at least once
soon after it arrives.
"""
from __future__ import annotations

import math

import numpy as np

from ddrl.acting.replay import ReplayMemory, Transitions

# Added to |TD error|: a transition with no error keeps a chance of being replayed.
PRIORITY_EPS = 1e-6


class SumTree:
    """Leaves in a binary tree whose every node holds the sum of its children; leaf i is
    found by a prefix sum in O(log n). Parents are recomputed from their children (never
    updated by differences), so float errors do not accumulate over millions of updates."""

    def __init__(self, size: int):
        self.size = size
        self.depth = max(size - 1, 0).bit_length()
        self.leaves = 1 << self.depth
        self.tree = np.zeros(2 * self.leaves)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        return self.tree[self.leaves + index]

    @property
    def values(self) -> np.ndarray:
        return self.tree[self.leaves:self.leaves + self.size]

    def set(self, index: np.ndarray, values: np.ndarray) -> None:
        """Leaves `index` take `values` (where an index repeats, its last value)."""
        node = np.asarray(index, np.int64) + self.leaves
        self.tree[node] = values
        # Parents shared by several leaves are summed once per leaf, to the same value: cheaper
        # than sorting them out (np.unique) at every level.
        for _ in range(self.depth):
            node //= 2
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def rebuild(self) -> None:
        """Every parent from the leaves (after the leaves were written directly)."""
        for level in range(self.depth, 0, -1):
            first = 1 << (level - 1)
            nodes = np.arange(first, 2 * first)
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaf where the running sum of the leaves passes each `mass` in [0, total)."""
        node = np.ones(len(mass), np.int64)
        mass = np.asarray(mass, np.float64).copy()
        for _ in range(self.depth):
            left = self.tree[2 * node]
            # Right only where the right child has mass: rounding cannot then end on an
            # empty leaf.
            right = (mass >= left) & (self.tree[2 * node + 1] > 0)
            mass -= np.where(right, left, 0.0)
            node = 2 * node + right
        return node - self.leaves


class Priorities:
    """What proportional prioritization is whatever it draws (transitions, sequences):
    priority^alpha from |error| + eps, the largest priority seen for what is new (saved with
    the memory), importance weights whose exponent beta is annealed to 1. Mixed in before a
    replay memory."""

    def __init__(self, alpha: float, beta: float):
        """`beta`: the importance-weight exponent at the start, annealed by `anneal`."""
        self.alpha, self.beta0, self.beta = alpha, beta, beta
        self.max_priority = 1.0

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "max_priority": np.float64(self.max_priority)}

    def restore(self, arrays: dict[str, np.ndarray], n: int) -> None:
        super().restore(arrays, n)
        saved = float(arrays["max_priority"])
        # A memory saved before non-finite errors were kept out may hold them.
        self.max_priority = saved if math.isfinite(saved) else 1.0

    def anneal(self, progress: float) -> None:
        """beta for the fraction `progress` of the run done: linearly from its start to 1."""
        self.beta = self.beta0 + (1.0 - self.beta0) * min(max(progress, 0.0), 1.0)

    def leaf_values(self, errors: np.ndarray) -> np.ndarray:
        """priority^alpha of new errors (priority |error| + eps), the largest priority kept.
        A non-finite error (a gradient the run drops) gets the largest priority, as a new step
        does: one NaN leaf would make the tree's total NaN and every later draw slot 0."""
        priority = np.abs(errors).astype(np.float64) + PRIORITY_EPS
        finite = np.isfinite(priority)
        if finite.any():
            self.max_priority = max(self.max_priority, float(priority[finite].max()))
        return np.where(finite, priority, self.max_priority) ** self.alpha

    def weights(self, count: int, leaves: np.ndarray, total: float) -> np.ndarray:
        """Importance weights (N P)^-beta of draws whose leaves are `leaves` out of `total`,
        N = `count` candidates, normalised by the batch's largest (Schaul et al.'s Algorithm 1)."""
        weights = (count * leaves / total) ** -self.beta
        return (weights / weights.max()).astype(np.float32)


class PrioritizedReplay(Priorities, ReplayMemory):
    def __init__(self, capacity: int, streams: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, stacked: bool, n: int, alpha: float, beta: float):
        """`n`: the return's steps (a transition needs its n successors)."""
        ReplayMemory.__init__(self, capacity, streams, obs_shape, obs_dtype, stacked)
        Priorities.__init__(self, alpha, beta)
        self.n = n
        self.tree = SumTree(streams * self.slots)
        # Transitions with a leaf above 0: N in the importance weights.
        self.valid = 0

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.tree.tree.nbytes

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "priorities": self.tree.values}

    def restore(self, arrays: dict[str, np.ndarray], n: int) -> None:
        """As the uniform memory's, and the priorities with them (a uniform memory's file
        has none: refused with ValueError)."""
        saved = arrays.get("priorities")
        if saved is None or saved.shape != self.tree.values.shape:
            found = "missing" if saved is None else f"{list(saved.shape)}"
            raise ValueError(f"priorities: {found}, expected {list(self.tree.values.shape)}")
        super().restore(arrays, n)
        saved = np.where(np.isfinite(saved), saved, self.max_priority ** self.alpha)
        self.tree.values[:] = np.where(self._valid_mask(), saved, 0.0)
        self.tree.rebuild()
        self.valid = int(np.count_nonzero(self.tree.values))

    def _valid_mask(self) -> np.ndarray:
        """(streams x slots,) whether each slot holds a transition that can be sampled now."""
        offset = (self.head[:, None] - 1 - np.arange(self.slots)[None, :]) % self.slots
        position = self.head[:, None] - 1 - offset
        return self._valid(np.repeat(np.arange(len(self.head)), self.slots), position.ravel())

    def _valid(self, s: np.ndarray, p: np.ndarray) -> np.ndarray:
        low, high = self.bounds(s, self.n)
        return (p >= low) & (p <= high) & self.acted[s, p % self.slots]

    def begin(self, streams: np.ndarray, obs: np.ndarray) -> None:
        before = self.head[streams].copy()
        super().begin(streams, obs)
        self._advance(np.asarray(streams), before)

    def add(self, streams: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, acted_at: np.ndarray, next_obs: np.ndarray) -> None:
        before = self.head[streams].copy()
        super().add(streams, actions, rewards, dones, acted_at, next_obs)
        self._advance(np.asarray(streams), before)

    def _advance(self, streams: np.ndarray, before: np.ndarray) -> None:
        """Leaves of the positions whose validity the streams' advance from `before` may have
        changed: the oldest (now without their frames) and the newest (now with n successors)."""
        old_low, old_high = self.window(before, self.n)
        new_low, new_high = self.window(self.head[streams], self.n)
        spans = [_spans(streams, old_low, new_low), _spans(streams, old_high + 1, new_high + 1)]
        s = np.concatenate([stream for stream, _ in spans])
        p = np.concatenate([position for _, position in spans])
        s, p = s[p >= 0], p[p >= 0]
        if not len(s):
            return
        index = s * self.slots + p % self.slots
        new = np.where(self._valid(s, p), self.max_priority ** self.alpha, 0.0)
        self.valid += int(np.count_nonzero(new)) - int(np.count_nonzero(self.tree.get(index)))
        self.tree.set(index, new)

    def sample(self, size: int, n: int, rng: np.random.Generator) -> Transitions:
        """`size` transitions drawn in proportion to their leaves, one from each of `size`
        equal strata of the total (lower variance than independent draws), with importance
        weights (N P(i))^-beta normalised by the batch's largest, as Schaul et al.'s
        Algorithm 1."""
        total = self.tree.total
        index = self.tree.find((np.arange(size) + rng.random(size)) * (total / size))
        s, slot = np.divmod(index, self.slots)
        p = self.head[s] - 1 - (self.head[s] - 1 - slot) % self.slots
        out = self.gather(s, p, n)
        out.weights = self.weights(self.valid, self.tree.get(index), total)
        return out

    def update(self, index: np.ndarray, errors: np.ndarray) -> None:
        """New priorities |error| + eps of sampled transitions; one that stopped being valid
        since it was sampled (overwritten) keeps its 0."""
        live = self.tree.get(index) > 0
        self.tree.set(index[live], self.leaf_values(errors)[live])


def _spans(streams: np.ndarray, start: np.ndarray, stop: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(stream, position) for every position of [start, stop) of each stream."""
    length = np.maximum(stop - start, 0)
    first = np.repeat(np.cumsum(length) - length, length)
    which = np.repeat(np.arange(len(streams)), length)
    return streams[which], start[which] + np.arange(length.sum()) - first
