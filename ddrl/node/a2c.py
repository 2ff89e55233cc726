"""Synchronous A2C: all simulators step together, one batched inference per step, one update
per t_max steps. Everything happens on the calling thread, in a fixed order, so a fixed seed
on a fixed world size reproduces the run."""
from __future__ import annotations

import time

import numpy as np

from ddrl.algos.actor_critic import nstep_returns
from ddrl.config import Config
from ddrl.node.base import Node
from ddrl.node.experience import Batch
from ddrl.node.learner import Learner, sample_actions


class A2CNode(Node):
    def __init__(self, cfg: Config, learner: Learner, rank: int, restart: int):
        super().__init__(cfg, learner, rank, restart)
        self._pool = self.make_pool("sim", cfg.node.n_sim)
        self._rng = self.rng("actions")
        self._obs = self._recv().obs

    def _recv(self):
        step = self._pool.recv()
        # The vector env may return simulators in any order; fixed order keeps runs repeatable.
        order = np.argsort(step.env_ids, kind="stable")
        step.env_ids, step.obs = step.env_ids[order], step.obs[order]
        step.reward, step.done = step.reward[order], step.done[order]
        self.record(len(order) * self._pool.frames_per_step, step.episodes)
        return step

    def next_batch(self) -> Batch:
        n = self.cfg.node
        obs, actions, rewards, dones = [], [], [], []
        t_predict = t_sim = 0.0
        for _ in range(n.t_max):
            t0 = time.perf_counter()
            logits, _ = self.learner.predict(self._obs)
            act = sample_actions(logits, self._rng)
            t1 = time.perf_counter()
            self._pool.send(act)
            step = self._recv()
            t_sim += time.perf_counter() - t1
            t_predict += t1 - t0
            obs.append(self._obs)
            actions.append(act)
            rewards.append(step.reward)
            dones.append(step.done)
            self._obs = step.obs
        t0 = time.perf_counter()
        _, bootstrap = self.learner.predict(self._obs)
        self.t_predict += t_predict + time.perf_counter() - t0
        self.t_sim += t_sim
        returns = nstep_returns(np.stack(rewards), np.stack(dones).astype(np.float32), bootstrap, n.gamma)
        size = n.t_max * n.n_sim
        return Batch(np.concatenate(obs), np.concatenate(actions), returns.reshape(size),
                     np.full(size, self.update, np.int64))

    def close(self) -> None:
        self._pool.close()
