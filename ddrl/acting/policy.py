"""What acting needs of a network beside the learner's `predict`: each simulator's recurrent
state carried from step to step, and sampling actions from the policy's logits."""
from __future__ import annotations

import numpy as np


class RecurrentState:
    """Each simulator's recurrent state while it acts, zeroed where a new game starts; for a
    feed-forward network (units 0) a plain call of `predict`. `rows` pick the simulators a
    call is about (all by default): central mode's batches hold some of them."""

    def __init__(self, simulators: int, units: int):
        self.units = units
        self.h = np.zeros((simulators, units), np.float32)
        self.c = np.zeros((simulators, units), np.float32)

    def state(self, rows=slice(None)) -> np.ndarray:
        """(rows, 2, units): what their next step is acted on, stored with R2D2's sequences."""
        return np.stack([self.h[rows], self.c[rows]], 1)

    def reset(self, starts: np.ndarray | None, rows=slice(None)) -> None:
        """Zeroes the state of the simulators whose observation begins a new game."""
        if self.units and starts is not None and starts.any():
            which = np.arange(len(self.h))[rows][starts]
            self.h[which] = 0.0
            self.c[which] = 0.0

    def step(self, predict, obs: np.ndarray, starts: np.ndarray | None = None,
             rows=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """The network's two outputs on one observation per simulator, each state carried
        on; `starts` marks observations that begin a new game."""
        if not self.units:
            return predict(obs)
        self.reset(starts, rows)
        q, q_max, self.h[rows], self.c[rows] = _one_step(predict, obs, self.h[rows],
                                                         self.c[rows])
        return q, q_max

    def peek(self, predict, obs: np.ndarray, rows=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """The outputs on observations that continue simulators `rows`, states unchanged (a
        game cut by the frame cap: the value of its last observation)."""
        if not self.units:
            return predict(obs)
        return _one_step(predict, obs, self.h[rows], self.c[rows])[:2]


def _one_step(predict, obs: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
    q, q_max, h, c = predict(obs[:, None], np.zeros((len(obs), 1), np.float32), h, c)
    return q[:, 0], q_max[:, 0], h, c


def sample_actions(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gumbel-max sampling from the policy with the rank's own generator (reproducible)."""
    return np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=-1).astype(np.int32)
