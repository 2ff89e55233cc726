"""Fake simulator streams for the replay memories' tests."""
from __future__ import annotations

import numpy as np

STACK, SIDE = 4, 3


class FakeStream:
    """A simulator whose every frame is unique (filled with its serial number), with frame
    stacks as ale-py gives them: a done restarts the stack with four new frames."""

    def __init__(self, rng: np.random.Generator, first_id: int):
        self.rng = rng
        self.next_id = first_id
        self.obs = self._fresh()

    def _frame(self) -> np.ndarray:
        self.next_id += 1
        return np.full((SIDE, SIDE), self.next_id, np.int32)

    def _fresh(self) -> np.ndarray:
        return np.stack([self._frame() for _ in range(STACK)])

    def step(self) -> tuple[int, float, bool, np.ndarray, np.ndarray]:
        action, reward = int(self.rng.integers(0, 6)), float(self.rng.normal())
        done = bool(self.rng.random() < 0.1)
        before = self.obs
        self.obs = self._fresh() if done else np.concatenate([self.obs[1:], self._frame()[None]])
        return action, reward, done, before, self.obs
