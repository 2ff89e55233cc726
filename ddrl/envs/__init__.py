"""Local simulators: ALE games (ale-py vector env) and gymnasium classic control, one pool API."""
from __future__ import annotations

import numpy as np

from ddrl.config import Config
from ddrl.envs.pool import SimPool, Step
from ddrl.errors import DdrlError

__all__ = ["SimPool", "Step", "action_names", "check_env_id", "env_spec", "frames_per_step",
           "make_pool"]


def check_env_id(env_id: str) -> None:
    """Unknown game ids fail before anything starts, with the id in the message."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    if env_id not in gym.envs.registry:
        hint = " (Atari games are named like ALE/Pong-v5)" if "/" not in env_id else ""
        raise DdrlError(f"config key env.id: unknown environment {env_id!r}{hint}")


def make_pool(cfg: Config, num_envs: int, seed: int, train: bool, batch_size: int = 0,
              rng: np.random.Generator | None = None, screen: bool = False) -> SimPool:
    """`batch_size < num_envs` gives asynchronous recv of whichever simulators are ready first;
    `screen` keeps an Atari game's colour screen in `pool.backend.screen` (one simulator)."""
    batch_size = batch_size or num_envs
    if cfg.is_atari:
        from ddrl.envs.atari import AtariBackend

        backend = AtariBackend(cfg.env, num_envs, batch_size, train, screen)
    else:
        from ddrl.envs.classic import ClassicBackend

        backend = ClassicBackend(cfg.env, num_envs)
    rng = rng if rng is not None else np.random.default_rng(seed)
    return SimPool(backend, seed, clip_rewards=train and cfg.env.clip_rewards and cfg.is_atari,
                   decorrelate=cfg.env.decorrelate if train else 0, rng=rng)


def env_spec(cfg: Config) -> tuple[tuple[int, ...], np.dtype, int]:
    """(observation shape, dtype, number of actions), read off a one-simulator backend."""
    if cfg.is_atari:
        from ddrl.envs.atari import AtariBackend

        backend = AtariBackend(cfg.env, 1, 1, train=False)
    else:
        from ddrl.envs.classic import ClassicBackend

        backend = ClassicBackend(cfg.env, 1)
    spec = (backend.obs_shape, backend.obs_dtype, backend.n_actions)
    backend.close()
    return spec


def frames_per_step(cfg: Config) -> int:
    """Emulator frames per agent step, as the pools count them."""
    return cfg.env.frame_skip if cfg.is_atari else 1


def action_names(cfg: Config) -> list[str]:
    """ALE's names of a game's actions (NOOP, FIRE, ...); numbers for other environments."""
    if not cfg.is_atari:
        return [str(a) for a in range(env_spec(cfg)[2])]
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(cfg.env.id)
    try:
        return list(env.unwrapped.get_action_meanings())
    finally:
        env.close()
