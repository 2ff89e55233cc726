"""`ddrl bench policies JOB.toml [--episodes N] [--seed S] [--set k=v ...]`: the scores an agent
must beat. Policies that learn nothing play the job's game under its evaluation protocol (no-op
starts, sticky actions, frame cap and `eval.epsilon`, as `ddrl eval` plays an agent): uniformly
random actions, and each action held for the whole game. A game where holding one action
scores well above random play (Beam Rider) sets a higher floor than random play does.
"""
from __future__ import annotations

import argparse

import numpy as np

from ddrl.errors import DdrlError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file (its env and eval sections are used)")
    p.add_argument("--episodes", type=int, help="games per policy (default: eval.episodes)")
    p.add_argument("--seed", type=int, default=12345, help="as `ddrl eval --seed`")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ddrl.commands.info import cpu_summary
    from ddrl.envs import action_names, frames_per_step
    from ddrl.loop.evaluator import play_games
    from ddrl.placement import load_job
    from ddrl.seeding import SEED_LIMIT

    if not 0 <= args.seed < SEED_LIMIT:
        raise DdrlError(f"--seed {args.seed}: must be in [0, {SEED_LIMIT})")
    cfg = load_job(args.job, args.set)
    episodes = cfg.eval.episodes if args.episodes is None else args.episodes
    if episodes < 1:
        raise DdrlError(f"--episodes {episodes}: at least 1 game per policy")
    names = action_names(cfg)
    n_actions = len(names)
    frame_skip = frames_per_step(cfg)
    env = cfg.env
    protocol = (f"up to {env.noop_max} no-ops at the start, sticky {env.sticky:g}, "
                f"cap {env.max_episode_frames:,} frames, " if cfg.is_atari else "")
    print(f"ddrl bench policies {args.job}: {env.id}, {episodes} games per policy, "
          f"{protocol}eval.epsilon {cfg.eval.epsilon:g}, seed {args.seed}; {cpu_summary()}",
          flush=True)
    print(f"{'policy':18s}{'mean':>10s}{'std':>9s}{'min':>9s}{'max':>9s}{'frames a game':>15s}",
          flush=True)
    rng = np.random.default_rng(args.seed)
    policies = [("random", lambda step: rng.random((len(step.obs), n_actions)))]
    policies += [(f"hold {name}", lambda step, a=a: np.eye(n_actions)[np.full(len(step.obs), a)])
                 for a, name in enumerate(names)]
    for label, scores in policies:
        games = play_games(cfg, episodes, args.seed, scores).games
        ret = np.array([r for r, _ in games])
        frames = np.mean([n for _, n in games]) * frame_skip
        print(f"{label:18s}{ret.mean():10.1f}{ret.std():9.1f}{ret.min():9.1f}{ret.max():9.1f}"
              f"{frames:15,.0f}", flush=True)
    return 0
