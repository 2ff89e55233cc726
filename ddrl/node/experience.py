"""n-step segments per simulator, and the FIFO of data points between actors and trainer."""
from __future__ import annotations

import queue
import threading

import numpy as np

from ddrl.algos.actor_critic import nstep_returns
from ddrl.algos.batch import Batch


class SegmentBuilder:
    """Collects one simulator's transitions until t_max steps or the end of its value chain."""

    def __init__(self, t_max: int, gamma: float):
        self.t_max = t_max
        self.gamma = gamma
        self._obs: list[np.ndarray] = []
        self._actions: list[int] = []
        self._rewards: list[float] = []
        self._dones: list[bool] = []
        self._acted_at: list[int] = []

    def add(self, obs: np.ndarray, action: int, reward: float, done: bool, acted_at: int) -> bool:
        """Returns True when the segment is complete and `flush` should be called."""
        self._obs.append(obs)
        self._actions.append(action)
        self._rewards.append(reward)
        self._dones.append(done)
        self._acted_at.append(acted_at)
        return done or len(self._actions) >= self.t_max

    def flush(self, bootstrap_value: float) -> Batch:
        returns = nstep_returns(np.array(self._rewards, np.float32),
                                np.array(self._dones, np.float32), bootstrap_value, self.gamma)
        batch = Batch(np.stack(self._obs), np.array(self._actions, np.int32),
                      np.array(self._acted_at, np.int64), {"returns": returns})
        self.__init__(self.t_max, self.gamma)
        return batch


class ExperienceFifo:
    """Bounded FIFO of segments; `take` cuts exactly n data points, keeping the rest."""

    def __init__(self, capacity_segments: int, stop: threading.Event):
        self._q: queue.Queue[Batch] = queue.Queue(maxsize=max(1, capacity_segments))
        self._stop = stop
        self._left: Batch | None = None

    def put(self, segment: Batch) -> bool:
        """Blocks while full; False once the node is stopping."""
        while not self._stop.is_set():
            try:
                self._q.put(segment, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self, n: int) -> Batch | None:
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
        batch = Batch.concat(parts) if len(parts) > 1 else parts[0]
        if have > n:
            batch, self._left = batch.split(n)
        return batch
