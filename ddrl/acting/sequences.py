"""R2D2's replay memory: the frame-once memory of `replay.py`, sampled as sequences.

A sequence is `span` consecutive steps of one simulator (burn-in, the steps learned, their n
successors), starting at every `period`-th step, so consecutive sequences overlap by
span - period. Steps are counted per stream apart from positions (after a done the stream
also holds the new game's whole frame stack, positions that are no step), and each stream
keeps the recurrent state its simulator acted with at every sequence start: one state per
`period` steps, not per step, as R2D2 stores them.

Prioritized (`PrioritizedSequences`), a sequence is drawn in proportion to priority^alpha,
its priority R2D2's mix of its steps' |TD errors| (`ddrl.algos.r2d2.sequence_priority`). With
one sequence per `period` steps there are few enough (25,000 for 1M frames in 4 streams) that
a prefix sum over them at each draw costs tens of microseconds: no sum tree to keep in step
with sequences that become whole or lose their oldest frames as the streams advance.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddrl.acting.prioritized import Priorities
from ddrl.acting.replay import ReplayMemory


@dataclass
class Sequences:
    """(B, span) observations (B, span, ...), actions, rewards, dones and game starts (1
    where a step's observation begins a new game after the sequence's first); the state
    (B, 2, units) the first step was acted on with; per sequence the update its first action
    was chosen at, importance weights and where it sits."""
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    starts: np.ndarray
    state: np.ndarray
    acted_at: np.ndarray
    weights: np.ndarray
    index: np.ndarray


class SequenceReplay(ReplayMemory):
    def __init__(self, capacity: int, streams: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, stacked: bool, units: int, period: int, span: int):
        super().__init__(capacity, streams, obs_shape, obs_dtype, stacked)
        self.period, self.span = period, span
        # The absolute position of each stream's k-th step at [stream, k % slots]: a stream
        # holds no more steps than positions.
        self.step_position = np.zeros((streams, self.slots), np.int64)
        self.steps = np.zeros(streams, np.int64)
        # Sequence starts held at once: at most slots // period + 1 of them.
        self.rings = self.slots // period + 1
        self.states = np.zeros((streams, self.rings, 2, units), np.float32)
        # Starts whose sequence would run across a restore (`restore`), never sampled.
        self.broken = np.zeros((streams, self.rings), bool)

    STATE = (*ReplayMemory.STATE, "step_position", "steps", "states", "broken")

    def restore(self, arrays: dict[str, np.ndarray], n: int) -> None:
        """As `ReplayMemory.restore`. The simulators go on with new games with no done
        between a stream's old steps and the new ones: sequences that would run from one into
        the other (at most span / period per stream) are left out."""
        super().restore(arrays, n)
        for stream, wall in enumerate(self.steps):
            first = max(wall - self.span + 1, 0)
            k = np.arange(-(-first // self.period) * self.period, wall, self.period)
            self.broken[stream, (k // self.period) % self.rings] = True

    def steps_needed(self, n: int) -> int:
        """A whole sequence (its n steps included)."""
        return self.span

    def add(self, streams: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, acted_at: np.ndarray, next_obs: np.ndarray,
            states: np.ndarray) -> None:
        """As `ReplayMemory.add`, with the (streams, 2, units) states each simulator acted on."""
        streams = np.asarray(streams)
        k = self.steps[streams]
        self.step_position[streams, k % self.slots] = self.head[streams] - 1
        first = k % self.period == 0
        ring = (k[first] // self.period) % self.rings
        self.states[streams[first], ring] = states[first]
        self.broken[streams[first], ring] = False
        self.steps[streams] += 1
        super().add(streams, actions, rewards, dones, acted_at, next_obs)

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """(stream, first step) of every sequence that can be sampled: all its steps known,
        its first step's whole frame stack still held."""
        first = -(-np.maximum(self.steps - self.slots, 0) // self.period) * self.period
        count = np.maximum((self.steps - self.span - first) // self.period + 1, 0)
        s = np.repeat(np.arange(len(self.steps)), count)
        k = first[s] + self.period * (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count,
                                                                         count))
        position = self.step_position[s, k % self.slots]
        held = position >= self.head[s] - self.slots + self.stack - 1
        held &= ~self.broken[s, (k // self.period) % self.rings]
        return s[held], k[held]

    def sample(self, size: int, n: int, rng: np.random.Generator) -> Sequences:
        """Uniformly `size` sequences (`n` is in the span already)."""
        s, k = self.candidates()
        if not len(s):
            raise ValueError("no whole sequence in the replay memory yet")
        pick = rng.integers(0, len(s), size)
        return self.gather(s[pick], k[pick])

    def gather(self, s: np.ndarray, k: np.ndarray) -> Sequences:
        steps = (k[:, None] + np.arange(self.span)[None, :]) % self.slots
        position = self.step_position[s[:, None], steps]
        slot = position % self.slots
        rows = s[:, None]
        obs = self._obs(np.repeat(s, self.span), position.ravel())
        dones = self.dones[rows, slot].astype(np.float32)
        starts = np.zeros_like(dones)
        starts[:, 1:] = dones[:, :-1]
        ring = (k // self.period) % self.rings
        return Sequences(obs.reshape(len(s), self.span, *obs.shape[1:]), self.actions[rows, slot],
                         self.rewards[rows, slot], dones, starts, self.states[s, ring],
                         self.acted_at[s, slot[:, 0]], np.ones(len(s), np.float32),
                         s * self.rings + ring)


class PrioritizedSequences(Priorities, SequenceReplay):
    def __init__(self, capacity: int, streams: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, stacked: bool, units: int, period: int, span: int,
                 alpha: float, beta: float):
        SequenceReplay.__init__(self, capacity, streams, obs_shape, obs_dtype, stacked, units,
                                period, span)
        Priorities.__init__(self, alpha, beta)
        # priority^alpha of the sequence starting at [stream, ring].
        self.leaves = np.zeros((streams, self.rings))

    STATE = (*SequenceReplay.STATE, "leaves")

    def restore(self, arrays: dict[str, np.ndarray], n: int) -> None:
        super().restore(arrays, n)
        # A memory saved before non-finite errors were kept out may hold them.
        self.leaves[~np.isfinite(self.leaves)] = self.max_priority ** self.alpha

    def add(self, streams: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, acted_at: np.ndarray, next_obs: np.ndarray,
            states: np.ndarray) -> None:
        """New sequence starts enter at the largest priority yet seen."""
        streams = np.asarray(streams)
        k = self.steps[streams]
        first = k % self.period == 0
        self.leaves[streams[first], (k[first] // self.period) % self.rings] = \
            self.max_priority ** self.alpha
        super().add(streams, actions, rewards, dones, acted_at, next_obs, states)

    def sample(self, size: int, n: int, rng: np.random.Generator) -> Sequences:
        """`size` sequences drawn in proportion to priority^alpha, one from each of `size`
        equal strata, with importance weights (N P)^-beta normalised by the batch's largest."""
        s, k = self.candidates()
        if not len(s):
            raise ValueError("no whole sequence in the replay memory yet")
        leaves = self.leaves[s, (k // self.period) % self.rings]
        cumulative = np.cumsum(leaves)
        total = cumulative[-1]
        mass = (np.arange(size) + rng.random(size)) * (total / size)
        pick = np.minimum(np.searchsorted(cumulative, mass, side="right"), len(s) - 1)
        out = self.gather(s[pick], k[pick])
        out.weights = self.weights(len(s), leaves[pick], total)
        return out

    def update(self, index: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities of sampled sequences (their index from `Sequences.index`)."""
        self.leaves.reshape(-1)[index] = self.leaf_values(priorities)
