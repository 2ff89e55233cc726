"""Whole evaluation games as a video (`ddrl eval RUN --video FILE.mp4|FILE.gif`): by default the
game's own colour screen, as CleanRL's, SB3's and Sample Factory's videos show it; with
`--video-view agent` the frames the agent saw (the newest of each observation, scaled up).
The game and its score so far are written on each frame. MP4 is streamed to ffmpeg (pip's
imageio-ffmpeg, or an `ffmpeg` on PATH); GIF is written by Pillow, which matplotlib brings."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from ddrl.acting.policy import RecurrentState
from ddrl.config import Config
from ddrl.envs import make_pool
from ddrl.errors import DdrlError
from ddrl.loop.evaluator import eval_actions
from ddrl.output import say

VIEWS = ("screen", "agent")
# The agent's 64x64 view is small: scaled up 3x. The screen (160x210) is scaled 2x in an MP4;
# a GIF holds every frame in memory, so it keeps the screen's own size.
AGENT_SCALE, MP4_SCREEN_SCALE = 3, 2
# Agent steps per second of the video: the game's own speed (60 frames/s, 4 frames per step).
STEPS_PER_SECOND = 15


def ffmpeg() -> str | None:
    """The ffmpeg program MP4s are written with, or None."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        return shutil.which("ffmpeg")


def check(cfg: Config, path: Path) -> None:
    """What can be known to fail before TensorFlow starts."""
    if not cfg.is_atari:
        raise DdrlError(f"--video: {cfg.env.id} has no screen; videos are of Atari games")
    if path.suffix.lower() not in (".mp4", ".gif"):
        raise DdrlError(f"--video {path}: the video is written as MP4 or GIF; name it FILE.mp4 "
                        "or FILE.gif")
    if path.suffix.lower() == ".mp4" and ffmpeg() is None:
        raise DdrlError(f"--video {path}: MP4 is written with ffmpeg, which is not installed "
                        "(pip install imageio-ffmpeg, or Debian's ffmpeg); name it FILE.gif")
    if not path.parent.is_dir():
        raise DdrlError(f"--video {path}: no such directory {path.parent}")


class _Gif:
    """Pillow writes a GIF from every frame at once: they are held, as palette images."""

    def __init__(self, path: Path):
        self.path, self.frames = path, []

    def add(self, image) -> None:
        self.frames.append(image if image.mode == "L" else image.quantize())

    def close(self) -> None:
        try:
            self.frames[0].save(self.path, save_all=True, append_images=self.frames[1:], loop=0,
                                duration=round(1000 / STEPS_PER_SECOND))
        except OSError as exc:
            raise DdrlError(f"--video {self.path}: cannot write it "
                            f"({exc.strerror or exc})") from None


class _Mp4:
    """Frames streamed to ffmpeg's H.264 encoder as they are played: nothing is held."""

    def __init__(self, path: Path):
        self.path, self.proc = path, None

    def add(self, image) -> None:
        if self.proc is None:
            self.proc = subprocess.Popen(
                [ffmpeg(), "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
                 "-s", f"{image.width}x{image.height}", "-r", str(STEPS_PER_SECOND), "-i", "-",
                 "-c:v", "libx264", "-pix_fmt", "yuv420p", str(self.path)],
                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.proc.stdin.write(image.convert("RGB").tobytes())
        except BrokenPipeError:
            self.close()
            raise DdrlError(f"--video {self.path}: ffmpeg stopped reading the frames") from None

    def close(self) -> None:
        self.proc.stdin.close()
        err = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
        if self.proc.wait() != 0:
            raise DdrlError(f"--video {self.path}: ffmpeg could not write it "
                            f"({err[-1] if err else f'exit {self.proc.returncode}'})")


def _frame(pool, step, view: str, scale_screen: int):
    from PIL import Image

    if view == "agent":
        image = Image.fromarray(step.obs[0][-1])
        scale = AGENT_SCALE
    else:
        image = Image.fromarray(pool.backend.screen)
        scale = scale_screen
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def record(cfg: Config, learner, path: Path, games: int, seed: int, minutes: float = 10.0,
           view: str = "screen") -> list[float]:
    """Play `games` whole games with the evaluated policy on one simulator and write the
    first `minutes` of them to `path` (`check`ed); the games' returns. The cap bounds a GIF's
    memory: a stuck agent's game (Breakout waiting for a FIRE, to the frame cap) would
    otherwise cost gigabytes."""
    from PIL import ImageDraw

    mp4 = path.suffix.lower() == ".mp4"
    writer = _Mp4(path) if mp4 else _Gif(path)
    pool = make_pool(cfg, 1, seed, train=False, screen=view == "screen")
    rng = np.random.default_rng(seed)
    state = RecurrentState(1, learner.recurrent)
    returns: list[float] = []
    score, shown, most, cut = 0.0, 0, max(1, round(minutes * 60 * STEPS_PER_SECOND)), False
    try:
        while len(returns) < games:
            step = pool.recv()
            score += float(step.reward[0])
            if shown < most:
                image = _frame(pool, step, view, MP4_SCREEN_SCALE if mp4 else 1)
                ImageDraw.Draw(image).text((4, 2), f"game {len(returns) + 1}  score {score:+.0f}",
                                           fill=255 if image.mode == "L" else (255, 255, 255))
                writer.add(image)
                shown += 1
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
    writer.close()
    return returns
