"""ALE games through ale-py's C++ `AtariVectorEnv`: preprocessing runs in C++ threads, GIL-free."""
from __future__ import annotations

import re

import numpy as np
from ale_py.vector_env import AtariVectorEnv

from ddrl.config import EnvConfig
from ddrl.envs.pool import RawStep
from ddrl.errors import DdrlError


def rom_name(env_id: str) -> str:
    """`ALE/Pong-v5` -> `pong`, `ALE/SpaceInvaders-v5` -> `space_invaders` (ale-py's ROM ids)."""
    game = env_id.split("/", 1)[1].rsplit("-v", 1)[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


# The Atari 2600's own screen, as ALE renders it.
SCREEN_HEIGHT, SCREEN_WIDTH = 210, 160


def _vector_env(cfg: EnvConfig, num_envs: int, batch_size: int, train: bool,
                **image) -> AtariVectorEnv:
    return AtariVectorEnv(
        rom_name(cfg.id), num_envs, batch_size=batch_size, num_threads=cfg.env_threads,
        max_num_frames_per_episode=cfg.max_episode_frames,
        repeat_action_probability=cfg.sticky, autoreset_mode="SameStep",
        frameskip=cfg.frame_skip, noop_max=cfg.noop_max, use_fire_reset=cfg.fire_reset,
        # Life loss ends the value chain only; the game itself resets on game over, so the
        # agent still sees late-game states (ale-py's episodic_life resets the whole game).
        episodic_life=False, life_loss_info=train and cfg.episodic_life,
        reward_clipping=False, **image,
    )


class AtariBackend:
    """`screen=True` (one simulator, for videos) keeps the game's colour screen of each step
    in `self.screen`: ale-py's vector env renders only the agent's view, so a second
    emulator with the same seed plays the same actions, and ALE being deterministic, the
    same game; its frame numbers and rewards are checked against the first's on every step."""

    def __init__(self, cfg: EnvConfig, num_envs: int, batch_size: int, train: bool,
                 screen: bool = False):
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.frames_per_step = cfg.frame_skip
        self._env = _vector_env(cfg, num_envs, batch_size, train,
                                img_height=cfg.size, img_width=cfg.size)
        self._twin = None
        self.screen: np.ndarray | None = None
        if screen:
            assert num_envs == 1, "the colour screen is kept for one simulator"
            self._twin = _vector_env(cfg, 1, 1, train, img_height=SCREEN_HEIGHT,
                                     img_width=SCREEN_WIDTH, grayscale=False, stack_num=1,
                                     maxpool=False)
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
        if self._twin is not None:
            self.screen = self._twin.reset(seed=seed)[0][0, -1]
        n = len(info["env_id"])
        return self._raw(obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), info)

    def send(self, actions: np.ndarray) -> None:
        self._env.send(actions)
        if self._twin is not None:
            self._twin.send(actions)

    def recv(self) -> RawStep:
        step = self._env.recv()
        if self._twin is not None:
            obs, reward, *_, info = self._twin.recv()
            if (info["episode_frame_number"][0] != step[4]["episode_frame_number"][0]
                    or reward[0] != step[1][0]):
                raise DdrlError("the colour screen's emulator lost step with the game it "
                                "shows (ale-py not deterministic here?); --video-view agent "
                                "records the agent's own frames")
            self.screen = obs[0, -1]
        return self._raw(*step)

    def close(self) -> None:
        self._env.close()
        if self._twin is not None:
            self._twin.close()
