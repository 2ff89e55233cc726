"""ALE games through ale-py's C++ `AtariVectorEnv`: preprocessing runs in C++ threads, GIL-free."""
from __future__ import annotations

import re

import numpy as np
from ale_py.vector_env import AtariVectorEnv

from ddrl.config import EnvConfig
from ddrl.envs.pool import RawStep


def rom_name(env_id: str) -> str:
    """`ALE/Pong-v5` -> `pong`, `ALE/SpaceInvaders-v5` -> `space_invaders` (ale-py's ROM ids)."""
    game = env_id.split("/", 1)[1].rsplit("-v", 1)[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


class AtariBackend:
    def __init__(self, cfg: EnvConfig, num_envs: int, batch_size: int, train: bool):
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.frames_per_step = cfg.frame_skip
        self._env = AtariVectorEnv(
            rom_name(cfg.id), num_envs, batch_size=batch_size, num_threads=cfg.env_threads,
            max_num_frames_per_episode=cfg.max_episode_frames,
            repeat_action_probability=cfg.sticky, autoreset_mode="SameStep",
            img_height=cfg.size, img_width=cfg.size,
            frameskip=cfg.frame_skip, noop_max=cfg.noop_max, use_fire_reset=cfg.fire_reset,
            # Life loss ends the value chain only; the game itself resets on game over, so the
            # agent still sees late-game states (ale-py's episodic_life resets the whole game).
            episodic_life=False, life_loss_info=train and cfg.episodic_life,
            reward_clipping=False,
        )
        self.n_actions = int(self._env.single_action_space.n)
        self.obs_shape = tuple(self._env.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.uint8)
        self._frame = np.zeros(num_envs, np.int64)

    def _raw(self, obs, reward, term, trunc, info) -> RawStep:
        ids = info["env_id"]
        frame = info["episode_frame_number"]
        new_game = frame < self._frame[ids]
        self._frame[ids] = frame
        truncated = trunc & ~term
        final_obs = info["final_obs"][truncated] if truncated.any() else None
        return RawStep(ids, obs, np.asarray(reward, np.float32), term | trunc, new_game,
                       truncated, final_obs)

    def reset(self, seed: int) -> RawStep:
        obs, info = self._env.reset(seed=seed)
        n = len(info["env_id"])
        return self._raw(obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), info)

    def send(self, actions: np.ndarray) -> None:
        self._env.send(actions)

    def recv(self) -> RawStep:
        return self._raw(*self._env.recv())

    def close(self) -> None:
        self._env.close()
