"""`ddrl bench compare-sb3 [--seconds S] [--game ALE/Pong-v5]`: Stable-Baselines3 A2C and ddrl
on the same game, side by side in one run, with the same work per update: 16 simulators,
5 steps each (80 data points), the Nature CNN, the same number of CPU threads.

SB3 runs as its users run it on Atari: `make_atari_env` (its AtariWrapper, DummyVecEnv),
`VecFrameStack(4)` and `A2C("CnnPolicy", n_steps=5)`; the v5 game's own frame skip is turned
off because AtariWrapper skips 4 frames itself (sticky actions 0.25 stay, as in ddrl).
stable-baselines3 is an optional extra (`pip install 'ddrl[sb3]'`), never a dependency.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

from ddrl.errors import DdrlError

N_ENVS = 16
N_STEPS = 5
# ddrl's node modes, with 80 data points per update either way; ba3c with two predictor
# threads, whose simulator groups step while the other one infers.
MODES = {"a2c": [f"acting.t_max={N_STEPS}"],
         "ba3c": [f"acting.batch_size={N_ENVS * N_STEPS}", "acting.predictors=2"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=60.0,
                   help="measured seconds of each run, after a warm-up (default 60)")
    p.add_argument("--game", default="ALE/Pong-v5", help="ALE game id (default ALE/Pong-v5)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="ddrl's nodes to run: a2c (t_max 5), ba3c (batch 80) (default both)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate SB3 and ddrl this many times, so drifting load hits both")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra ddrl config override (repeatable), e.g. model.precision=bfloat16")


def sb3_rate(game: str, seconds: float, warmup: float, threads: int, seed: int = 0) -> float:
    """SB3 A2C agent steps/s after `warmup` seconds of training."""
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    torch.set_num_threads(threads)

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.start = self.t0 = self.n0 = self.rate = None

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            now = time.perf_counter()
            if self.t0 is None:
                if now - self.start >= warmup:
                    self.t0, self.n0 = now, self.num_timesteps
                return True
            if now - self.t0 < seconds:
                return True
            self.rate = (self.num_timesteps - self.n0) / (now - self.t0)
            return False

    env = VecFrameStack(make_atari_env(game, n_envs=N_ENVS, seed=seed,
                                       env_kwargs={"frameskip": 1}), n_stack=4)
    clock = Clock()
    try:
        A2C("CnnPolicy", env, n_steps=N_STEPS, device="cpu", seed=seed).learn(
            total_timesteps=10**12, callback=clock)
    finally:
        env.close()
    return clock.rate


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("stable_baselines3") is None:
        raise DdrlError("stable-baselines3 is not installed: pip install 'ddrl[sb3]' "
                        "(install a CPU-only torch build first)")
    from ddrl.bench.node import measure_training, warmup_seconds
    from ddrl.cpus import cores_per_rank
    from ddrl.envs import check_env_id
    from ddrl.placement import load_job

    if args.seconds <= 0 or args.rounds < 1:
        raise DdrlError("--seconds must be > 0 and --rounds >= 1")
    if not args.game.startswith("ALE/"):
        raise DdrlError(f"--game {args.game!r}: compare-sb3 needs an ALE game like ALE/Pong-v5")
    check_env_id(args.game)
    base = [f"env.id={args.game}", f"acting.n_sim={N_ENVS}", "model.arch=nature",
            "sync.backend=none", *args.set]
    configs = {m: load_job(None, [f"acting.mode={m}", *MODES[m], *base])
               for m in args.modes}
    threads = cores_per_rank(next(iter(configs.values())).acting.threads, 1)
    print(f"compare-sb3 {args.game}: {N_ENVS} simulators, Nature CNN, {N_ENVS * N_STEPS} data "
          f"points per update, {threads} CPU threads, {args.seconds:g} s measured per run "
          f"after a warm-up; ddrl in {next(iter(configs.values())).model.precision}", flush=True)
    print(f"{'round':>5s}{'SB3 A2C steps/s':>17s}"
          + "".join(f"{'ddrl ' + m + ' steps/s':>20s}{'/ SB3':>7s}" for m in configs), flush=True)
    ratios: dict[str, list[float]] = {m: [] for m in configs}
    with tempfile.TemporaryDirectory(prefix="ddrl-sb3-") as tmp:
        for r in range(args.rounds):
            sb3 = sb3_rate(args.game, args.seconds, warmup_seconds(args.seconds), threads)
            row = f"{r + 1:5d}{sb3:17,.0f}"
            for mode, cfg in configs.items():
                job = Path(tmp) / f"{mode}.toml"
                job.write_text(cfg.to_toml())
                ours = measure_training(str(job), [], args.seconds, cfg.env.frame_skip).agent_steps
                ratios[mode].append(ours / sb3)
                row += f"{ours:20,.0f}{ours / sb3:7.2f}"
            print(row, flush=True)
    if args.rounds > 1:
        for mode, rs in ratios.items():
            print(f"ddrl {mode} / SB3 over {args.rounds} rounds: median {statistics.median(rs):.2f} "
                  f"(min {min(rs):.2f}, max {max(rs):.2f})")
    return 0
