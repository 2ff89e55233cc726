"""Gymnasium classic control (CartPole-v1) for fast tests, behind the same send/recv pool."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ddrl.config import EnvConfig
from ddrl.envs.pool import RawStep
from ddrl.errors import DdrlError


class ClassicBackend:
    frames_per_step = 1

    def __init__(self, cfg: EnvConfig, num_envs: int):
        self.num_envs = num_envs
        self.batch_size = num_envs
        self._env = SyncVectorEnv([lambda: gym.make(cfg.id) for _ in range(num_envs)],
                                  autoreset_mode=AutoresetMode.SAME_STEP)
        self.n_actions = int(self._env.single_action_space.n)
        size = self._env.single_observation_space.shape[0]
        if any(i >= size for i in cfg.observe):
            self._env.close()
            raise DdrlError(f"config key env.observe: {cfg.observe} picks from {cfg.id}'s "
                            f"{size} state variables (indices 0-{size - 1})")
        self._shown = np.array(cfg.observe) if cfg.observe else slice(None)
        self.obs_shape = (len(cfg.observe) or size,)
        self.obs_dtype = np.dtype(np.float32)
        self._ids = np.arange(num_envs)
        self._actions: np.ndarray | None = None

    def reset(self, seed: int) -> RawStep:
        obs, _ = self._env.reset(seed=seed)
        zeros = np.zeros(self.num_envs, bool)
        return RawStep(self._ids, self._show(obs), np.zeros(self.num_envs, np.float32),
                       zeros, zeros, zeros)

    def _show(self, obs: np.ndarray) -> np.ndarray:
        return obs[:, self._shown].astype(np.float32)

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> RawStep:
        obs, reward, term, trunc, info = self._env.step(self._actions)
        done = term | trunc
        truncated = trunc & ~term
        final_obs = self._show(np.stack(info["final_obs"][truncated])) if truncated.any() else None
        return RawStep(self._ids, self._show(obs), reward.astype(np.float32), done, done,
                       truncated, final_obs)

    def close(self) -> None:
        self._env.close()
