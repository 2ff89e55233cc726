"""Evaluation: greedy (or epsilon-greedy) actions, frozen weights, separate simulators, no reward
clipping or episodic life (the papers' score); in the background of a run, or for `ddrl eval`."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ddrl.config import Config
from ddrl.envs import make_pool
from ddrl.learner import RecurrentState
from ddrl.seeding import derive_seed

MAX_EVAL_SIMS = 16


@dataclass
class EvalResult:
    mean: float
    std: float
    max: float
    episodes: int


def eval_actions(cfg: Config, logits: np.ndarray, n_actions: int,
                 rng: np.random.Generator) -> np.ndarray:
    """The evaluated policy's actions from the network's first output (logits or Q-values):
    greedy, or epsilon-greedy with `eval.epsilon`."""
    actions = np.argmax(logits, axis=-1).astype(np.int32)
    if cfg.eval.epsilon > 0:
        # DQN's evaluation convention: a greedy policy that waits for a FIRE it never
        # presses (Breakout after a lost life) would otherwise play to the frame cap.
        explore = rng.random(len(actions)) < cfg.eval.epsilon
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
    return actions


def evaluate(cfg: Config, learner, episodes: int, seed: int,
             stop: threading.Event | None = None) -> EvalResult | None:
    """Play `episodes` whole games; each simulator plays its share so long games count too.
    None when `stop` is set before they are all played."""
    n = min(episodes, MAX_EVAL_SIMS)
    quota = np.array([len(part) for part in np.array_split(np.arange(episodes), n)])
    pool = make_pool(cfg, n, seed, train=False)
    rng = np.random.default_rng(seed)
    state = RecurrentState(n, learner.recurrent)
    returns: list[float] = []
    try:
        while quota.any():
            if stop is not None and stop.is_set():
                return None
            step = pool.recv()
            logits, _ = state.step(learner.predict, step.obs, step.done)
            pool.send(eval_actions(cfg, logits, pool.n_actions, rng))
            for env, ret, _ in step.episodes:
                if quota[env] > 0:
                    quota[env] -= 1
                    returns.append(ret)
    finally:
        pool.close()
    r = np.array(returns)
    return EvalResult(float(r.mean()), float(r.std()), float(r.max()), len(r))


@dataclass
class EvalDone:
    """A finished evaluation, attributed to the update, frames and wall time at which its
    weights were taken."""
    update: int
    frames: int
    wall_time: float
    result: EvalResult
    weights: np.ndarray


class BackgroundEvaluator:
    """Rank 0 evaluates a snapshot of the weights on its own thread and model copy, so the
    other ranks never wait for it in the all-reduce (the paper used a separate node)."""

    def __init__(self, cfg: Config, learner_factory):
        self._cfg = cfg
        self._learner = learner_factory()
        self._thread: threading.Thread | None = None
        self._result: EvalDone | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, weights: np.ndarray, update: int, frames: int, wall_time: float) -> None:
        self._learner.set_weights(weights)

        def work():
            try:
                seed = derive_seed(self._cfg.run.seed, 0, f"eval/{update}")
                res = evaluate(self._cfg, self._learner, self._cfg.eval.episodes, seed, self._stop)
                if res is not None:
                    self._result = EvalDone(update, frames, wall_time, res, weights)
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=work, daemon=True, name="evaluator")
        self._thread.start()

    def cancel(self) -> None:
        """Abandon a game in progress, and any later one, and wait for the thread: a run that
        stops on a signal calls it last, since a process must not exit while this thread is
        inside the emulator or TensorFlow (that ended in a crash at interpreter exit, not in
        the run's exit status)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def poll(self, wait: bool = False, stop: threading.Event | None = None) -> EvalDone | None:
        """The finished evaluation, once; `wait` for one in progress, unless `stop` is set
        first, which abandons it."""
        while wait and self.busy:
            if stop is not None and stop.is_set():
                self.cancel()
                break
            self._thread.join(timeout=0.1)
        if self._error is not None:
            raise self._error
        out, self._result = self._result, None
        return out
