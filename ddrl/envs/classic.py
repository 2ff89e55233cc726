"""Gymnasium classic control (CartPole-v1) for fast tests, behind the same send/recv pool."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ddrl.config import EnvConfig
from ddrl.envs.pool import RawStep


class ClassicBackend:
    frames_per_step = 1

    def __init__(self, cfg: EnvConfig, num_envs: int):
        self.num_envs = num_envs
        self.batch_size = num_envs
        self._env = SyncVectorEnv([lambda: gym.make(cfg.id) for _ in range(num_envs)],
                                  autoreset_mode=AutoresetMode.SAME_STEP)
        self.n_actions = int(self._env.single_action_space.n)
        self.obs_shape = tuple(self._env.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.float32)
        self._ids = np.arange(num_envs)
        self._actions: np.ndarray | None = None

    def reset(self, seed: int) -> RawStep:
        obs, _ = self._env.reset(seed=seed)
        zeros = np.zeros(self.num_envs, bool)
        return RawStep(self._ids, obs.astype(np.float32), np.zeros(self.num_envs, np.float32),
                       zeros, zeros, zeros)

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> RawStep:
        obs, reward, term, trunc, info = self._env.step(self._actions)
        done = term | trunc
        truncated = trunc & ~term
        final_obs = (np.stack(info["final_obs"][truncated]).astype(np.float32)
                     if truncated.any() else None)
        return RawStep(self._ids, obs.astype(np.float32), reward.astype(np.float32), done, done,
                       truncated, final_obs)

    def close(self) -> None:
        self._env.close()
