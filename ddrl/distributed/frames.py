"""Frame stacks over the wire, newest frame only (central mode's observations).

An Atari observation is a stack of the last k frames, newest last; from one step of a game to
the next the stack slides by one frame. So an actor sends a simulator's whole stack only when
the learner does not hold its previous one (the simulator's first step, and every step that
starts a new game, whose stack is new), and otherwise its newest frame alone: k times fewer
bytes. The learner keeps each simulator's stack and slides the new frame into it. Vector
observations (not stacks) always go whole.

Layout of one message's observation bytes: the whole stacks (in the order of the step's
simulators), then the newest frames of the others (same order).
"""
from __future__ import annotations

import numpy as np


class StackSender:
    """An actor's side, for one pool of `num_envs` simulators."""

    def __init__(self, num_envs: int, stacked: bool):
        self._stacked = stacked
        self._known = np.zeros(num_envs, bool)

    def encode(self, env_ids: np.ndarray, obs: np.ndarray, new_stack: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """(whole: which simulators go whole, the bytes). `new_stack`: the step began a new
        game for these simulators."""
        whole = ~self._known[env_ids] | new_stack if self._stacked else np.ones(len(env_ids), bool)
        self._known[env_ids] = True
        parts = [obs[whole], obs[~whole][:, -1:]] if self._stacked else [obs]
        return whole, np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(-1)
                                      for p in parts])


class StackReceiver:
    """The learner's side: the stacks of `num_envs` simulators (learner-wide indices)."""

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], dtype: np.dtype, stacked: bool):
        self._stacked = stacked
        self._shape = obs_shape
        self._dtype = np.dtype(dtype)
        self._stacks = np.zeros((num_envs, *obs_shape), self._dtype) if stacked else None
        # Bytes of a whole observation, and of what goes in its place otherwise.
        self._row = int(np.prod(obs_shape)) * self._dtype.itemsize
        self._part = self._row // obs_shape[0] if stacked else self._row

    def nbytes(self, whole: np.ndarray) -> int:
        """The size of a message's observation bytes with this `whole` mask."""
        k = int(whole.sum())
        return k * self._row + (len(whole) - k) * self._part

    def decode(self, env_ids: np.ndarray, whole: np.ndarray, data: np.ndarray) -> np.ndarray:
        """The simulators' stacks, with this message's frames slid in."""
        if not self._stacked:
            return data.view(self._dtype).reshape(len(env_ids), *self._shape)
        k = int(whole.sum())
        full = data[:k * self._row].view(self._dtype).reshape(k, *self._shape)
        newest = data[k * self._row:].view(self._dtype).reshape(len(env_ids) - k, 1, *self._shape[1:])
        stacks = self._stacks
        stacks[env_ids[whole]] = full
        slide = env_ids[~whole]
        stacks[slide] = np.concatenate([stacks[slide, 1:], newest], axis=1)
        return stacks[env_ids].copy()
