"""A simulator pool with the node's view of it: recv a batch of ready simulators, send their actions.

Backends (ale-py's C++ vector env, gymnasium classic control) only step; this layer adds
what the node needs on top of every backend: reward clipping for training, start-state
decorrelation, and the real (unclipped, whole-game) episode returns for the log.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class RawStep:
    env_ids: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    # The value chain stops here: game over, truncation, or a lost life with episodic life.
    done: np.ndarray
    # The simulator started a new game with this observation (game over or truncation).
    new_game: np.ndarray
    # The frame cap (not the game) ended the game: its value chain is cut, not finished.
    truncated: np.ndarray
    # The last observation of each truncated game, in the order of `truncated`'s true rows.
    final_obs: np.ndarray | None = None


@dataclass
class Step:
    env_ids: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray | None
    # (env_id, return, length in agent steps) of whole games that ended with this step.
    episodes: list[tuple[int, float, int]] = field(default_factory=list)

    def reorder(self, order: np.ndarray) -> None:
        """Rows in `order`; final_obs follows its truncated rows."""
        if self.final_obs is not None:
            rank = np.cumsum(self.truncated) - 1
            self.final_obs = self.final_obs[rank[order][self.truncated[order]]]
        self.env_ids, self.obs = self.env_ids[order], self.obs[order]
        self.reward, self.done = self.reward[order], self.done[order]
        self.truncated = self.truncated[order]


class Backend(Protocol):
    num_envs: int
    batch_size: int
    n_actions: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    frames_per_step: int

    def reset(self, seed: int) -> RawStep: ...
    def send(self, actions: np.ndarray) -> None: ...
    def recv(self) -> RawStep: ...
    def close(self) -> None: ...


class SimPool:
    """Strictly alternating `recv()` then `send(actions)` for the simulators that recv returned."""

    def __init__(self, backend: Backend, seed: int, clip_rewards: bool, decorrelate: int,
                 rng: np.random.Generator):
        self.backend = backend
        self.num_envs = backend.num_envs
        self.batch_size = backend.batch_size
        self.n_actions = backend.n_actions
        self.obs_shape = backend.obs_shape
        self.frames_per_step = backend.frames_per_step
        self._clip = clip_rewards
        self._rng = rng
        self._start(seed)
        if decorrelate:
            self._decorrelate(decorrelate)

    def _start(self, seed: int) -> None:
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)
        self._started = np.zeros(self.num_envs, bool)
        self._pending: RawStep | None = self.backend.reset(seed)
        # Batches the backend has ready or stepping, beyond `_pending`: an asynchronous
        # reset returns one batch and queues the rest.
        self._in_flight = self.num_envs // self.batch_size - 1

    def restart(self, seed: int) -> None:
        """New games on the same simulators, as a pool made with `seed` would play them (no
        decorrelation: evaluation's pools): making ALE's simulators costs far more than
        resetting them. The steps still in flight are received first and dropped, so no
        old game's step comes back after the reset."""
        for _ in range(self._in_flight):
            self.backend.recv()
        self._start(seed)

    def _decorrelate(self, max_steps: int) -> None:
        """Random actions for a random count per simulator, no-ops for those already done.

        These steps stay part of the game they start, so the first logged return of each
        simulator is its whole game; games that end meanwhile are not logged.
        """
        left = self._rng.integers(0, max_steps + 1, size=self.num_envs)
        while left.any():
            ids = self.recv().env_ids
            actions = np.where(left[ids] > 0, self._rng.integers(0, self.n_actions, len(ids)), 0)
            left[ids] = np.maximum(left[ids] - 1, 0)
            self.send(actions)

    def recv(self) -> Step:
        if self._pending is None:
            raw = self.backend.recv()
            self._in_flight -= 1
        else:
            raw, self._pending = self._pending, None
        ids = raw.env_ids
        # A simulator's first observation is its reset's, no step: an asynchronous pool's
        # reset returns one batch, the others' come with the next receives.
        stepped = self._started[ids]
        self._started[ids] = True
        self._returns[ids[stepped]] += raw.reward[stepped]
        self._lengths[ids[stepped]] += 1
        episodes = []
        for i in np.flatnonzero(raw.new_game):
            env = int(ids[i])
            # SameStep autoreset: this step's reward closes the old game, its obs opens the next.
            if self._lengths[env] > 0:
                episodes.append((env, float(self._returns[env]), int(self._lengths[env])))
            self._returns[env] = 0.0
            self._lengths[env] = 0
        reward = np.clip(raw.reward, -1.0, 1.0) if self._clip else raw.reward
        return Step(ids, raw.obs, reward.astype(np.float32), raw.done, raw.truncated,
                    raw.final_obs, episodes)

    def send(self, actions: np.ndarray) -> None:
        self.backend.send(np.asarray(actions, dtype=np.int32))
        self._in_flight += 1

    def close(self) -> None:
        self.backend.close()
