"""Synchronous A2C with alternating simulator groups (`acting.groups`, two by default:
accelerated-methods paper, 4.1).

While the network infers actions for one group, the other group's simulators step in their
own vector env's C++ threads (both release the GIL), so neither the emulator nor the
network waits for the other. Each group is stepped synchronously and everything runs on the
calling thread in a fixed order, so a fixed seed on a fixed world size reproduces the run.

The forward pass on a group's last observation gives both the bootstrap values of this batch
and the first actions of the next, which go out at once: the simulators step while the
trainer computes the update, and one forward pass per update is saved. Those first actions
come from the weights before the update (the trainer sees it as a policy lag of 1 / t_max).
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np

from ddrl.acting.base import Actors
from ddrl.acting.policy import RecurrentState, sample_actions
from ddrl.algos.base import log_prob
from ddrl.algos.batch import Batch, Rollout
from ddrl.config import Config
from ddrl.envs import SimPool, Step
from ddrl.learner import Learner


class A2CActors(Actors):
    def __init__(self, cfg: Config, learner: Learner, rank: int, restart: int):
        super().__init__(cfg, learner, rank, restart)
        groups = np.array_split(np.arange(cfg.acting.n_sim), min(cfg.acting.groups, cfg.acting.n_sim))
        self.pools: list[SimPool] = [self.make_pool(f"sim{g}", len(members))
                                     for g, members in enumerate(groups)]
        self._rngs = [self.rng(f"actions{g}") for g in range(len(groups))]
        self._minibatch_rng = self.rng("minibatches")
        # Per group: the observation its simulators are acting on, the actions sent for it,
        # their log-probabilities, the critic's values of the observation, and the update
        # those actions were chosen at.
        self._obs: list[np.ndarray] = [np.empty(0)] * len(groups)
        self._actions: list[np.ndarray] = [np.empty(0, np.int32)] * len(groups)
        self._logp: list[np.ndarray] = [np.empty(0, np.float32)] * len(groups)
        self._values: list[np.ndarray] = [np.empty(0, np.float32)] * len(groups)
        self._acted_at = [0] * len(groups)
        # A recurrent network's (algo.recurrent): each simulator's LSTM state, the state each
        # acted from at its group's last step, and whether that step's observation began a game.
        self._states = [RecurrentState(len(members), learner.recurrent) for members in groups]
        self._state_in: list[np.ndarray] = [np.empty(0, np.float32)] * len(groups)
        self._starts: list[np.ndarray] = [np.ones(len(members), bool) for members in groups]
        # Minibatches of the last rollout still to train on (several with PPO's epochs).
        self._pending: list[Batch] = []
        for g in range(len(groups)):
            self._act(g, self._recv(g).obs, self._starts[g])

    def _recv(self, group: int) -> Step:
        pool = self.pools[group]
        step = pool.recv()
        # A group is stepped whole, but the vector env may list its simulators in any order.
        order = np.argsort(step.env_ids, kind="stable")
        step.reorder(order)
        step.reward = self.bootstrap_truncated(
            step, partial(self._states[group].peek, self.learner.predict, rows=step.truncated))
        self.record(len(order) * pool.frames_per_step, step.episodes)
        return step

    def _act(self, group: int, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Sends the group its next actions; returns the values of `obs`, whose `starts`
        begin a new game."""
        state = self._states[group]
        self._starts[group] = starts
        if state.units:
            state.reset(starts)
            self._state_in[group] = state.state()
        logits, values = state.step(self.learner.predict, obs)
        actions = sample_actions(logits, self._rngs[group])
        self.pools[group].send(actions)
        self._obs[group], self._actions[group], self._acted_at[group] = obs, actions, self.update
        self._logp[group], self._values[group] = log_prob(logits, actions), values
        return values

    def next_batch(self) -> Batch:
        if not self._pending:
            self._pending = self.learner.algo.minibatches(self._rollout(), self._minibatch_rng)
        return self._pending.pop(0)

    def _rollout(self) -> Batch:
        n = self.cfg.acting
        bootstrap = [np.empty(0, np.float32)] * len(self.pools)
        # The state each simulator acted from at the rollout's first step (recurrent only).
        first_state = list(self._state_in)
        steps = []
        t_sim = t_predict = 0.0
        for _ in range(n.t_max):
            parts = []
            for g in range(len(self.pools)):
                t0 = time.perf_counter()
                step = self._recv(g)
                t1 = time.perf_counter()
                parts.append((self._obs[g], self._actions[g],
                              np.full(len(step.env_ids), self._acted_at[g], np.int64),
                              step.reward, step.done, self._values[g], self._logp[g],
                              self._starts[g]))
                bootstrap[g] = self._act(g, step.obs, step.done)
                t_sim += t1 - t0
                t_predict += time.perf_counter() - t1
            steps.append([np.concatenate(column) for column in zip(*parts)])
        with self._lock:
            self.t_sim += t_sim
            self.t_predict += t_predict
        # (t_max, n_sim, ...) arrays: time-major, simulators in a fixed order.
        obs, actions, acted_at, rewards, dones, values, logp, starts = (
            np.stack(column) for column in zip(*steps))
        # Acting and learning weights differ by at most the first actions of each rollout, so
        # off-policy algorithms take the actor's policy as the learner's here.
        targets = self.learner.algo.targets(Rollout(rewards, dones.astype(np.float32), values,
                                                    logp, np.concatenate(bootstrap)))
        if self.learner.recurrent:
            # One data point per simulator: its whole rollout, simulator-major.
            targets = {k: v.swapaxes(0, 1) for k, v in targets.items()}
            targets["starts"] = starts.swapaxes(0, 1).astype(np.float32)
            targets["state"] = np.concatenate(first_state)
            return Batch(obs.swapaxes(0, 1), actions.swapaxes(0, 1), acted_at.swapaxes(0, 1),
                         targets)
        size = n.t_max * n.n_sim
        return Batch(obs.reshape(size, *obs.shape[2:]), actions.reshape(size),
                     acted_at.reshape(size), {k: v.reshape(size) for k, v in targets.items()})

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
