"""Segments of consecutive steps per simulator, the FIFO between actors and trainer, and the
batch an algorithm trains on, cut from whole segments."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ddrl.algos.base import RolloutAlgorithm, log_prob
from ddrl.algos.batch import Batch, Rollout

Predict = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass
class Segment:
    """One simulator's consecutive steps with what the actor knew when it chose each action.

    Only the last step can be `done`; otherwise `next_obs` is the observation after the last
    step and `bootstrap` the actor's value of it.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    logp: np.ndarray
    values: np.ndarray
    acted_at: np.ndarray
    next_obs: np.ndarray | None
    bootstrap: float
    # A recurrent network's (algo.recurrent): whether each step's observation began a game, and
    # the LSTM state the simulator acted from at the first step, (2, units).
    starts: np.ndarray | None = None
    state: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.actions)

    def split(self, n: int) -> tuple["Segment", "Segment"]:
        """The first n steps, bootstrapped on step n's observation, and the rest."""
        head = [getattr(self, f)[:n] for f in _STEP_FIELDS]
        tail = [getattr(self, f)[n:] for f in _STEP_FIELDS]
        return (Segment(*head, next_obs=self.obs[n], bootstrap=float(self.values[n])),
                Segment(*tail, next_obs=self.next_obs, bootstrap=self.bootstrap))


_STEP_FIELDS = ("obs", "actions", "rewards", "dones", "logp", "values", "acted_at")


class SegmentBuilder:
    """Collects one simulator's transitions until t_max steps or the end of its value chain;
    for a recurrent network (`recurrent`) always t_max steps, games ending inside (each
    segment is one sequence the learner unrolls, of one length)."""

    def __init__(self, t_max: int, recurrent: bool = False):
        self.t_max, self.recurrent = t_max, recurrent
        self._steps: list[tuple] = []
        self._starts: list[bool] = []
        self._state: np.ndarray | None = None

    def add(self, obs: np.ndarray, action: int, reward: float, done: bool, logp: float,
            value: float, acted_at: int, start: bool = False, state: np.ndarray | None = None
            ) -> bool:
        """Returns True when the segment is complete and `flush` should be called. `start`:
        `obs` began a game; `state`: the recurrent state the action was chosen from."""
        if self.recurrent:
            if not self._steps:
                # A copy: the caller's array moves on with the simulator.
                self._state = state.copy()
            self._starts.append(start)
        self._steps.append((obs, action, reward, done, logp, value, acted_at))
        return (done and not self.recurrent) or len(self._steps) >= self.t_max

    def flush(self, next_obs: np.ndarray | None, bootstrap: float) -> Segment:
        """`next_obs` and its value `bootstrap` follow the last step (None and 0 if it ended)."""
        obs, actions, rewards, dones, logp, values, acted_at = zip(*self._steps)
        starts = np.array(self._starts, np.float32) if self.recurrent else None
        self._steps, self._starts = [], []
        return Segment(np.stack(obs), np.array(actions, np.int32), np.array(rewards, np.float32),
                       np.array(dones, np.float32), np.array(logp, np.float32),
                       np.array(values, np.float32), np.array(acted_at, np.int64),
                       None if dones[-1] else next_obs, 0.0 if dones[-1] else bootstrap,
                       starts, self._state)


class ExperienceFifo:
    """Bounded FIFO of segments; `take` cuts exactly n steps, keeping the rest."""

    def __init__(self, capacity_segments: int, stop: threading.Event):
        self._q: queue.Queue[Segment] = queue.Queue(maxsize=max(1, capacity_segments))
        self._stop = stop
        self._left: Segment | None = None

    def put(self, segment: Segment) -> bool:
        """Blocks while full; False once the node is stopping."""
        while not self._stop.is_set():
            try:
                self._q.put(segment, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self, n: int) -> list[Segment] | None:
        parts, have = [], 0
        if self._left is not None:
            parts, have, self._left = [self._left], len(self._left), None
        while have < n:
            try:
                seg = self._q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return None
                continue
            parts.append(seg)
            have += len(seg)
        if have > n:
            parts[-1], self._left = parts[-1].split(len(parts[-1]) - (have - n))
        return parts


def segments_batch(segments: list[Segment], algo: RolloutAlgorithm, predict: Predict) -> Batch:
    """The algorithm's targets on the segments, as one batch in the segments' order.

    Segments are right-aligned in a (T, N) time-major rollout, so each one's last step meets
    its own bootstrap; the padding in front is never read. Off-policy algorithms get the
    learner's current policy and values: one forward pass over the steps and the bootstrap
    observations.
    """
    lengths = np.array([len(s) for s in segments])
    T, N = int(lengths.max()), len(segments)
    real = np.arange(T)[:, None] >= (T - lengths)[None, :]

    def rollout(column: np.ndarray) -> np.ndarray:
        out = np.zeros((T, N), np.float32)
        out.T[real.T] = column
        return out

    def flat(name: str) -> np.ndarray:
        return np.concatenate([getattr(s, name) for s in segments])

    obs, actions = flat("obs"), flat("actions")
    if not algo.off_policy:
        values, bootstrap = flat("values"), np.array([s.bootstrap for s in segments], np.float32)
        target_logp = None
    else:
        ends = [i for i, s in enumerate(segments) if s.next_obs is not None]
        rows = np.concatenate([obs, np.stack([segments[i].next_obs for i in ends])]) if ends else obs
        logits, current = predict(rows)
        target_logp = rollout(log_prob(logits[:len(obs)], actions))
        values = current[:len(obs)]
        bootstrap = np.zeros(N, np.float32)
        bootstrap[ends] = current[len(obs):]
    targets = algo.targets(Rollout(rollout(flat("rewards")), rollout(flat("dones")),
                                   rollout(values), rollout(flat("logp")), bootstrap, target_logp))
    return Batch(obs, actions, flat("acted_at"), {k: v.T[real.T] for k, v in targets.items()})


def sequences_batch(segments: list[Segment], algo: RolloutAlgorithm, predict: Predict) -> Batch:
    """A recurrent network's batch: each segment one data point, a sequence of the same T
    steps (obs (T, ...), actions and targets (T,), the game starts, the state it was acted
    from). Off-policy algorithms get the learner's current policy and values by unrolling
    each sequence from its stored state, and the bootstrap value from the state it ends in."""
    def stack(name: str) -> np.ndarray:
        return np.stack([getattr(s, name) for s in segments])

    obs, actions, starts, state = stack("obs"), stack("actions"), stack("starts"), stack("state")
    n, t = actions.shape
    if not algo.off_policy:
        values, target_logp = stack("values"), None
        bootstrap = np.array([s.bootstrap for s in segments], np.float32)
    else:
        logits, values, h, c = predict(obs, starts, state[:, 0], state[:, 1])
        target_logp = log_prob(logits.reshape(n * t, -1), actions.ravel()).reshape(n, t).T
        bootstrap = np.zeros(n, np.float32)
        if ends := [i for i, s in enumerate(segments) if s.next_obs is not None]:
            last = np.stack([segments[i].next_obs for i in ends])[:, None]
            bootstrap[ends] = predict(last, np.zeros((len(ends), 1), np.float32), h[ends],
                                      c[ends])[1][:, 0]
    # The algorithm's targets on the time-major rollout, then back to one row per sequence.
    targets = algo.targets(Rollout(stack("rewards").T, stack("dones").T, values.T,
                                   stack("logp").T, bootstrap, target_logp))
    return Batch(obs, actions, stack("acted_at"),
                 {**{k: v.T for k, v in targets.items()}, "starts": starts, "state": state})
