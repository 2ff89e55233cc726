"""DQN's replay memory, storing each frame once.

Each simulator writes its own stream: at a game's start (and after every done, where the
simulator's frame stack restarts) the whole stack the network saw is stored, after that only
each step's newest frame, so an observation is always the `stack` frames ending at its
position, exactly the stack the simulator returned. A 4-frame stack costs a quarter of storing
observations, and nothing is stored twice for the next observation. Streams are circular:
the oldest positions are overwritten once `capacity` frames are held in all.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Transitions:
    """A sample of the memory: observations, actions, the (n, B) rewards and dones from each,
    the observations n steps on, the update each action was chosen at."""
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    next_obs: np.ndarray
    acted_at: np.ndarray
    # Importance weights of the loss (1 where sampling is uniform).
    weights: np.ndarray
    # Where each sits: stream x slots + slot, the key of its priority.
    index: np.ndarray


# Rounds of draws in a row that found nothing before the sampler checks that anything can be
# found (a memory whose every candidate is rare is still drawn from).
EMPTY_ROUNDS = 64


class ReplayMemory:
    def __init__(self, capacity: int, streams: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, stacked: bool):
        """`stacked`: observations are frame stacks along axis 0 (Atari); otherwise each
        observation is one position (vector observations)."""
        self.stack = obs_shape[0] if stacked else 1
        frame_shape = obs_shape[1:] if stacked else obs_shape
        self.slots = capacity // streams
        self.frames = np.zeros((streams, self.slots, *frame_shape), obs_dtype)
        self.actions = np.zeros((streams, self.slots), np.int32)
        self.rewards = np.zeros((streams, self.slots), np.float32)
        self.dones = np.zeros((streams, self.slots), bool)
        self.acted_at = np.zeros((streams, self.slots), np.int64)
        # An action was taken at this position: a transition starts here.
        self.acted = np.zeros((streams, self.slots), bool)
        # The absolute position each stream writes next; its last one holds the observation
        # its simulator is acting on now.
        self.head = np.zeros(streams, np.int64)
        self.transitions = 0

    # What the memory is: saved and restored whole (`dqn.save_replay`).
    STATE = ("frames", "actions", "rewards", "dones", "acted_at", "acted", "head")

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)

    def state(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.STATE}

    def restore(self, arrays: dict[str, np.ndarray], n: int) -> None:
        """Takes the arrays of `state()` over (not copied: a full memory is gigabytes); a
        memory of another shape or type (the job changed) is refused with ValueError.

        The simulators go on with new games, with no done between a stream's old steps and
        the new ones: each stream's last n - 1 transitions, whose n following steps would run
        into the new game, are dropped."""
        for name in self.STATE:
            mine, saved = getattr(self, name), arrays.get(name)
            if saved is None or saved.shape != mine.shape or saved.dtype != mine.dtype:
                found = "missing" if saved is None else f"{saved.dtype}{list(saved.shape)}"
                raise ValueError(f"{name}: {found}, expected {mine.dtype}{list(mine.shape)}")
        for name in self.STATE:
            setattr(self, name, arrays[name])
        for stream, head in enumerate(self.head):
            for position in range(max(head - n, head - self.slots, 0), head):
                self.acted[stream, position % self.slots] = False
        self.transitions = int(self.acted.sum())

    def steps_needed(self, n: int) -> int:
        """Steps of every stream before each has something to sample: a transition and its
        n successors."""
        return n + 1

    def _push(self, stream: int, frames: np.ndarray) -> None:
        for frame in frames:
            slot = self.head[stream] % self.slots
            self.transitions -= int(self.acted[stream, slot])
            self.frames[stream, slot] = frame
            self.acted[stream, slot] = False
            self.head[stream] += 1

    def begin(self, streams: np.ndarray, obs: np.ndarray) -> None:
        """Streams whose simulator starts on `obs`, its first observation."""
        for stream, o in zip(streams, obs):
            self._push(stream, o if self.stack > 1 else o[None])

    def add(self, streams: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, acted_at: np.ndarray, next_obs: np.ndarray) -> None:
        """One step of each stream: the action taken on its current observation, the reward
        and done it led to, and the observation it is on now."""
        slots = (self.head[streams] - 1) % self.slots
        self.actions[streams, slots] = actions
        self.rewards[streams, slots] = rewards
        self.dones[streams, slots] = dones
        self.acted_at[streams, slots] = acted_at
        self.acted[streams, slots] = True
        self.transitions += len(streams)
        for stream, done, o in zip(streams, dones, next_obs):
            if self.stack == 1:
                self._push(stream, o[None])
            else:
                # After a done the simulator's stack restarts (new game or lost life): all of it.
                self._push(stream, o if done else o[-1:])

    def sample(self, size: int, n: int, rng: np.random.Generator) -> Transitions:
        """Uniformly `size` transitions whose n following steps are known. Needs a stream with
        more than n steps."""
        streams_n = len(self.head)
        picked_s, picked_p = [], []
        wanted, empty_rounds = size, 0
        while wanted > 0:
            if empty_rounds == EMPTY_ROUNDS and not self._any_candidate(n):
                # Drawing on would never end: no stream holds a transition and its n steps.
                raise ValueError(f"no transition with its {n} following steps in the replay "
                                 "memory yet")
            s = rng.integers(0, streams_n, 2 * wanted)
            low, high = self.bounds(s, n)
            ok = high >= low
            s, low, high = s[ok], low[ok], high[ok]
            p = low + (rng.random(len(s)) * (high - low + 1)).astype(np.int64)
            ok = self.acted[s, p % self.slots]
            picked_s.append(s[ok][:wanted])
            picked_p.append(p[ok][:wanted])
            wanted -= len(picked_s[-1])
            empty_rounds = empty_rounds + 1 if not len(picked_s[-1]) else 0
        return self.gather(np.concatenate(picked_s), np.concatenate(picked_p), n)

    def _any_candidate(self, n: int) -> bool:
        """Whether some stream holds an acted step whose stack and n successors are held."""
        low, high = self.bounds(np.arange(len(self.head)), n)
        for s in np.flatnonzero(high >= low):
            if self.acted[s, np.arange(low[s], high[s] + 1) % self.slots].any():
                return True
        return False

    def bounds(self, s: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first and last absolute positions of streams `s` that can start a transition:
        its whole stack still held, its n following steps known."""
        low, high = self.window(self.head[s], n)
        return np.maximum(low, 0), high

    def window(self, head: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`bounds` of streams whose heads are `head`, the first not clipped at 0."""
        return head - self.slots + self.stack - 1, head - 1 - n

    def gather(self, s: np.ndarray, p: np.ndarray, n: int) -> Transitions:
        """The transitions at absolute positions `p` of streams `s`. Steps after a done belong
        to the next game and are cut by it."""
        steps = (p[None, :] + np.arange(n)[:, None]) % self.slots
        return Transitions(self._obs(s, p), self.actions[s, p % self.slots], self.rewards[s, steps],
                           self.dones[s, steps].astype(np.float32), self._obs(s, p + n),
                           self.acted_at[s, p % self.slots], np.ones(len(s), np.float32),
                           s * self.slots + p % self.slots)

    def _obs(self, s: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self.stack == 1:
            return self.frames[s, p % self.slots]
        window = (p[:, None] + np.arange(1 - self.stack, 1)[None, :]) % self.slots
        return self.frames[s[:, None], window]
