"""`ddrl eval DIR|CHECKPOINT`: greedy games with a run's saved weights, optionally as a video."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ddrl.commands.args import positive_float, positive_int
from ddrl.errors import DdrlError
from ddrl.loop import video
from ddrl.loop.evaluator import evaluate
from ddrl.rundir import checkpoint
from ddrl.seeding import SEED_LIMIT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="run directory or checkpoint file")
    p.add_argument("--episodes", type=positive_int, help="games to play (default: eval.episodes)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--best", action="store_true",
                   help="the run's best-evaluated weights (checkpoints/best.npz), not its last")
    p.add_argument("--video", type=Path, metavar="FILE.mp4|FILE.gif",
                   help="play the games on one simulator and write them as a video, the score "
                        "on each frame (--episodes default: 1)")
    p.add_argument("--video-view", choices=video.VIEWS, default="screen",
                   help="the game's colour screen (default) or the frames the agent saw")
    p.add_argument("--video-minutes", type=positive_float, default=10.0, metavar="M",
                   help="the video holds the first M minutes of play (default 10: a GIF "
                        "writer holds every frame in memory)")


def run(args: argparse.Namespace) -> int:
    from ddrl.config import load_config
    from ddrl.envs import action_names, check_env_id, env_spec

    if not 0 <= args.seed < SEED_LIMIT:
        raise DdrlError(f"--seed {args.seed}: must be in [0, {SEED_LIMIT})")
    target = Path(args.target)
    if target.is_dir() and args.best:
        run_dir, ckpt_path = target, target / "checkpoints" / checkpoint.BEST
    elif target.is_dir():
        run_dir, ckpt_path = target, checkpoint.latest(target / "checkpoints")
        if ckpt_path is None:
            raise DdrlError(f"no checkpoint in {target / 'checkpoints'}")
    elif target.is_file():
        run_dir, ckpt_path = target.parent.parent, target
    elif target.suffix == ".npz":
        raise DdrlError(f"no such checkpoint: {target}")
    else:
        raise DdrlError(f"no such run directory or checkpoint: {target}")
    cfg = load_config(run_dir / "config.toml", check_env=check_env_id)
    if args.video is not None:
        video.check(cfg, args.video)
    ckpt = checkpoint.load(ckpt_path)
    # TensorFlow's start-up takes seconds: only once the inputs are known to be good.
    from ddrl.learner import Learner

    learner = Learner(cfg, *env_spec(cfg))
    learner.set_weights(ckpt.weights)
    if args.video is not None:
        returns = video.record(cfg, learner, args.video, args.episodes or 1, args.seed,
                               args.video_minutes, args.video_view)
        print(f"{ckpt_path}: update {ckpt.update}, frames {ckpt.frames:,}: wrote {len(returns)} "
              f"game(s) to {args.video}, returns {' '.join(f'{r:+.0f}' for r in returns)}")
        return 0
    res = evaluate(cfg, learner, args.episodes or cfg.eval.episodes, args.seed)
    print(f"{ckpt_path}: update {ckpt.update}, frames {ckpt.frames:,}: mean {res.mean:.2f} "
          f"+- {res.std:.2f}, max {res.max:.1f} over {res.episodes} episodes")
    share = res.actions / res.actions.sum()
    names = action_names(cfg)
    print("actions: " + ", ".join(f"{names[a]} {share[a]:.1%}" for a in np.argsort(-share)
                                  if share[a] > 0))
    return 0
