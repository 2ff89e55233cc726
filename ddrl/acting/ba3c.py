"""The paper's BA3C node: predictor threads batch whichever simulators are ready, a FIFO of
n-step segments decouples acting from training, and the trainer takes fixed-size batches.

The algorithm computes its targets when the trainer takes a batch: on-policy ones (a2c, ppo)
from what the actors recorded, off-policy ones (vtrace, appo) with the current weights, which
is what corrects for the FIFO's policy lag.

Each predictor owns a group of simulators in one ale-py vector env whose C++ threads step
while the predictor runs inference (both release the GIL); the trainer runs concurrently.
"""
from __future__ import annotations

import math
import threading
import time
from functools import partial

import numpy as np

from ddrl.acting.base import Actors
from ddrl.acting.experience import ExperienceFifo, SegmentBuilder, segments_batch, sequences_batch
from ddrl.acting.policy import RecurrentState, sample_actions
from ddrl.algos.base import log_prob
from ddrl.algos.batch import Batch
from ddrl.config import Config
from ddrl.envs import SimPool
from ddrl.learner import Learner


class BA3CActors(Actors):
    def __init__(self, cfg: Config, learner: Learner, rank: int, restart: int,
                 pools: list[SimPool] | None = None):
        """`pools`: simulators made elsewhere (central mode's remote ones); by default this
        rank's own, `acting.predictors` groups of `acting.n_sim`."""
        super().__init__(cfg, learner, rank, restart)
        n = cfg.acting
        self._stop = threading.Event()
        capacity = n.queue_size or 4 * n.batch_size
        self.fifo = ExperienceFifo(math.ceil(capacity / n.t_max), self._stop)
        self.pools: list[SimPool] = pools or [
            self.make_pool(f"sim{g}", len(members), inference_batch(cfg, len(members)))
            for g, members in enumerate(np.array_split(np.arange(n.n_sim), n.predictors))]
        self._threads = [threading.Thread(target=self._predictor, args=(g, pool), daemon=True,
                                          name=f"predictor-{g}")
                         for g, pool in enumerate(self.pools)]
        self._error: BaseException | None = None
        self._minibatch_rng = self.rng("minibatches")
        # Minibatches of the last batch still to train on (several with PPO's epochs).
        self._pending: list[Batch] = []

    def start(self, stopping) -> None:
        for t in self._threads:
            t.start()

    def _predictor(self, group: int, pool) -> None:
        try:
            self._predict_loop(group, pool)
        except BaseException as exc:  # surfaced to the trainer thread, which owns the exit
            self._error = exc
            self._stop.set()

    def _predict_loop(self, group: int, pool) -> None:
        n = self.cfg.acting
        rng = self.rng(f"actions{group}")
        units = self.learner.recurrent
        builders = [SegmentBuilder(n.t_max, recurrent=bool(units)) for _ in range(pool.num_envs)]
        # What each simulator is waiting on the result of: the observation, the action chosen
        # for it, its log-probability and the critic's value of the observation; with a
        # recurrent network also whether the observation began a game and the state the action
        # was chosen from.
        last_obs: list[np.ndarray | None] = [None] * pool.num_envs
        last_action = np.zeros(pool.num_envs, np.int32)
        last_logp = np.zeros(pool.num_envs, np.float32)
        last_value = np.zeros(pool.num_envs, np.float32)
        last_start = np.ones(pool.num_envs, bool)
        state = RecurrentState(pool.num_envs, units)
        last_state = state.state()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            step = pool.recv()
            t1 = time.perf_counter()
            ids = step.env_ids
            # Before the states move on: a game cut by the frame cap continues from them.
            reward = self.bootstrap_truncated(
                step, partial(state.peek, self.learner.predict, rows=ids[step.truncated]))
            if units:
                starts = step.done | np.array([last_obs[env] is None for env in ids])
                state.reset(starts, ids)
                acted_from = state.state(ids)
            logits, values = state.step(self.learner.predict, step.obs, rows=ids)
            actions = sample_actions(logits, rng)
            pool.send(actions)
            logp = log_prob(logits, actions)
            t2 = time.perf_counter()
            update = self.update
            for i, env in enumerate(ids):
                if last_obs[env] is not None:
                    done = bool(step.done[i])
                    if builders[env].add(last_obs[env], last_action[env], float(reward[i]), done,
                                         last_logp[env], last_value[env], update,
                                         last_start[env], last_state[env]):
                        segment = builders[env].flush(step.obs[i], float(values[i]))
                        if not self.fifo.put(segment):
                            return
                last_obs[env] = step.obs[i]
                last_action[env], last_logp[env], last_value[env] = actions[i], logp[i], values[i]
            if units:
                last_start[ids], last_state[ids] = starts, acted_from
            with self._lock:
                self.t_sim += t1 - t0
                self.t_predict += t2 - t1
            self.record(len(ids) * pool.frames_per_step, step.episodes)

    def next_batch(self) -> Batch | None:
        if not self._pending:
            segments = self.fifo.take(self.cfg.acting.batch_size)
            if self._error is not None:
                raise self._error
            if segments is None:
                return None
            algo = self.learner.algo
            to_batch = sequences_batch if self.learner.recurrent else segments_batch
            batch = to_batch(segments, algo, self.learner.predict)
            self._pending = algo.minibatches(batch, self._minibatch_rng)
        return self._pending.pop(0)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:  # a node can close before it started
                t.join(timeout=10)
        for pool in self.pools:
            pool.close()


def inference_batch(cfg: Config, group_size: int) -> int:
    # Something must step while a predictor infers: with one predictor, the other half of its
    # group; with several, the other predictors' groups, so whole groups make larger batches
    # (1.1x the node rate with the Nature CNN on 2 cores, measured interleaved).
    default = group_size if cfg.acting.predictors > 1 else max(1, group_size // 2)
    return min(cfg.acting.predict_batch or default, group_size)
