"""Whole evaluation games as an animated GIF (`ddrl eval RUN --video FILE.gif`): the frames the
agent saw (the newest frame of each observation, scaled up), the game and its score so far
written on each. Pillow, which matplotlib already brings, writes it: nothing to download."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ddrl.config import Config
from ddrl.envs import make_pool
from ddrl.errors import DdrlError
from ddrl.learner import RecurrentState
from ddrl.loop.evaluator import eval_actions
from ddrl.output import say

SCALE = 3
# Agent steps per second of the GIF: the game's own speed (60 frames/s, 4 frames per step).
STEPS_PER_SECOND = 15


def check(cfg: Config, path: Path) -> None:
    """What can be known to fail before TensorFlow starts."""
    if not cfg.is_atari:
        raise DdrlError(f"--video: {cfg.env.id} has no screen; videos are of Atari games")
    if path.suffix.lower() != ".gif":
        raise DdrlError(f"--video {path}: the video is written as a GIF; name it FILE.gif")
    if not path.parent.is_dir():
        raise DdrlError(f"--video {path}: no such directory {path.parent}")


def record(cfg: Config, learner, path: Path, games: int, seed: int,
           minutes: float = 10.0) -> list[float]:
    """Play `games` whole games with the evaluated policy on one simulator and write the
    first `minutes` of them to `path` (`check`ed); the games' returns. The GIF writer holds
    every frame: a stuck agent's game (Breakout waiting for a FIRE, to the frame cap) would
    otherwise cost gigabytes."""
    from PIL import Image, ImageDraw

    pool = make_pool(cfg, 1, seed, train=False)
    rng = np.random.default_rng(seed)
    state = RecurrentState(1, learner.recurrent)
    frames: list[Image.Image] = []
    returns: list[float] = []
    score, most, cut = 0.0, max(1, round(minutes * 60 * STEPS_PER_SECOND)), False
    try:
        while len(returns) < games:
            step = pool.recv()
            score += float(step.reward[0])
            if len(frames) < most:
                screen = Image.fromarray(step.obs[0][-1]).resize(
                    (step.obs.shape[-1] * SCALE, step.obs.shape[-2] * SCALE), Image.NEAREST)
                ImageDraw.Draw(screen).text(
                    (4, 2), f"game {len(returns) + 1}  score {score:+.0f}", fill=255)
                frames.append(screen)
            elif not cut:
                cut = True
                say(f"[ddrl] note: --video holds the first {minutes:g} minutes of play "
                    "(--video-minutes); the games go on to their end for their returns",
                    err=True)
            for _, ret, _ in step.episodes:
                returns.append(ret)
                score = 0.0
            logits, _ = state.step(learner.predict, step.obs, step.done)
            pool.send(eval_actions(cfg, logits, pool.n_actions, rng))
    finally:
        pool.close()
    try:
        frames[0].save(path, save_all=True, append_images=frames[1:], loop=0,
                       duration=round(1000 / STEPS_PER_SECOND))
    except OSError as exc:
        raise DdrlError(f"--video {path}: cannot write it ({exc.strerror or exc})") from None
    return returns
