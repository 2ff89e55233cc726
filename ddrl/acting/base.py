"""What the training loop needs from a rank's actors, whichever way they gather experience."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np

from ddrl.algos.batch import Batch
from ddrl.config import Config
from ddrl.envs import Step, make_pool
from ddrl.learner import Learner
from ddrl.seeding import derive_seed, rng


class Actors:
    """Counters are cumulative; the trainer logs their differences per update."""

    def __init__(self, cfg: Config, learner: Learner, rank: int, restart: int):
        self.cfg = cfg
        self.learner = learner
        self.rank = rank
        # Seeds differ per restart too, so a resumed run does not replay the same games.
        self._restart = restart
        self.frames = 0
        self.t_sim = 0.0
        self.t_predict = 0.0
        self.update = 0
        # The fraction of run.max_frames done, all ranks together (set by the trainer).
        self.progress = 0.0
        self._episodes: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def check_memory(self, local_ranks: int) -> None:
        """Refuse now a run whose memory this node cannot hold when full (hours later, as an
        OOM kill). On-policy actors hold a rollout or two: nothing to check."""

    def make_pool(self, name: str, num_envs: int, batch_size: int = 0):
        tag = f"{name}/{self._restart}"
        return make_pool(self.cfg, num_envs, derive_seed(self.cfg.run.seed, self.rank, tag),
                         train=True, batch_size=batch_size,
                         rng=rng(self.cfg.run.seed, self.rank, tag + "/decorrelate"))

    def rng(self, name: str) -> np.random.Generator:
        return rng(self.cfg.run.seed, self.rank, f"{name}/{self._restart}")

    def bootstrap_truncated(self, step: Step, predict=None) -> np.ndarray:
        """Rewards plus gamma V(last observation) where the frame cap cut a game, V the second
        output of `predict` (by default the learner's: its critic, or max_a Q).

        A truncated game is not over: its value chain ends with the critic's estimate, not
        zero. The step stays `done`, because the next observation belongs to a new game.
        """
        if step.final_obs is None:
            return step.reward
        reward = step.reward.copy()
        predict = predict or self.learner.predict
        reward[step.truncated] += self.cfg.algo.gamma * predict(step.final_obs)[1]
        return reward

    def record(self, frames: int, episodes: list[tuple[int, float, int]]) -> None:
        with self._lock:
            self.frames += frames
            self._episodes.extend((ret, length) for _, ret, length in episodes)

    def pop_episodes(self) -> list[tuple[float, int]]:
        """(return, length) of the games finished since the last call."""
        with self._lock:
            out, self._episodes = self._episodes, []
        return out

    def save_state(self, directory: Path, update: int) -> None:
        """On every rank, after `close()` at a stop whose last update is checkpointed: what the
        node keeps beyond the weights (by default nothing)."""

    def restore_state(self, directory: Path, update: int) -> None:
        """On `--resume`, before `start()`: what `save_state` kept for this update."""

    def start(self, stopping: Callable[[], bool]) -> None:
        """Before the first batch; `stopping()` tells a long start that a stop was asked for."""

    def next_batch(self) -> Batch | None:
        raise NotImplementedError

    def learned(self, per_sample: np.ndarray | None) -> None:
        """After the gradient of the last batch: the loss's figure per data point, where the
        algorithm has one (prioritized replay's TD errors)."""

    def ranks(self) -> list["Actors"]:
        """The ranks of the job whose batches this process computes gradients on, each a
        contributor to the all-reduce: itself, or its virtual ranks (acting/virtual.py)."""
        return [self]

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        """Telemetry of the actors' own for the run log: table -> rows, per update over the
        `updates` since the last call (central mode: a `/ranks` row per actor rank)."""
        return {}

    def close(self) -> None:
        pass
