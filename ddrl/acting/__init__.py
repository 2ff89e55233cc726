"""A rank's actors: its simulators, the threads that choose their actions, and what turns their
steps into training batches (a FIFO of n-step segments, or a replay memory).

`ba3c.py` is the paper's node (asynchronous predictors feeding a FIFO), `a2c.py` its
synchronous variant, `dqn.py` DQN's samplers and replay memory (`replay.py`); `base.py` is
what the training loop needs of all of them.
"""
from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Callable

from ddrl.config import Config
from ddrl.errors import DdrlError

if TYPE_CHECKING:  # both bring TensorFlow, which choosing a class must not wait for
    from ddrl.acting.base import Actors
    from ddrl.learner import Learner


def _check_a2c(cfg: Config) -> None:
    a = cfg.acting
    rollout = a.n_sim * a.t_max * cfg.env.frame_skip
    if rollout > cfg.run.max_frames:
        raise DdrlError(f"config key run.max_frames: {cfg.run.max_frames:,} is less than one rollout "
                        f"of one rank (acting.n_sim x acting.t_max x env.frame_skip = {rollout:,} frames)")
    # A recurrent network's data points are sequences: a rollout per simulator.
    if cfg.algo.recurrent and cfg.algo.minibatches > a.n_sim:
        raise DdrlError(f"config key algo.minibatches: {cfg.algo.minibatches} minibatches of "
                        f"{a.n_sim} sequences (a recurrent network's data points: each "
                        "simulator's rollout on the a2c node)")
    if cfg.algo.minibatches > a.n_sim * a.t_max:
        raise DdrlError("config key algo.minibatches: more minibatches than data points in a "
                        "rollout (acting.n_sim x acting.t_max)")


def _check_ba3c(cfg: Config) -> None:
    a = cfg.acting
    if a.n_sim < a.predictors:
        raise DdrlError("config key acting.predictors: more predictor threads than simulators (acting.n_sim)")
    if cfg.algo.recurrent and a.batch_size % a.t_max:
        raise DdrlError(f"config key acting.batch_size: {a.batch_size} is not a whole number "
                        f"of acting.t_max = {a.t_max} steps (a recurrent network learns on "
                        "sequences of acting.t_max)")
    # A recurrent network's data points are sequences: segments of acting.t_max steps.
    if cfg.algo.recurrent and cfg.algo.minibatches > a.batch_size // a.t_max:
        raise DdrlError(f"config key algo.minibatches: {cfg.algo.minibatches} minibatches of "
                        f"{a.batch_size // a.t_max} sequences (a recurrent network's data points: "
                        "acting.batch_size / acting.t_max on the ba3c node)")
    if cfg.algo.minibatches > a.batch_size:
        raise DdrlError("config key algo.minibatches: more minibatches than data points in a "
                        "batch (acting.batch_size)")


def replay_frames_needed(cfg: Config, streams: int) -> int:
    """The smallest replay memory whose `streams` each hold two frame stacks and n-step
    transitions, or two of R2D2's sequences (burn-in, the steps learned, their n-step
    successors) wherever they start."""
    a = cfg.dqn
    stack = 4 if cfg.is_atari else 1
    steps = (a.burn_in + a.sequence + a.sequence_period) if a.recurrent else 1
    return streams * (stack + steps + a.n_step) * 2


def _check_dqn(cfg: Config) -> None:
    a = cfg.dqn
    if cfg.algo.recurrent:
        raise DdrlError("config key algo.recurrent: a recurrent actor-critic runs on the a2c or "
                        "ba3c node (central mode's too) with an actor-critic algo.name; R2D2 is "
                        "dqn.recurrent")
    if a.concurrent and a.target_period % a.train_period:
        raise DdrlError(f"config key dqn.target_period: {a.target_period} is not a multiple of "
                        f"dqn.train_period ({a.train_period}), so concurrent training cannot "
                        "train target_period / train_period minibatches per period")
    if a.replay_frames < replay_frames_needed(cfg, a.samplers):
        raise DdrlError(f"config key dqn.replay_frames: {a.replay_frames} frames cannot hold "
                        f"{a.samplers} samplers' stacks and {a.n_step}-step transitions")


# acting.mode -> its actors' module and class (imported only when chosen: they bring
# TensorFlow) and its check of the config, which runs wherever a job is read, before that.
ACTORS: dict[str, tuple[str, str, Callable[[Config], None]]] = {
    "ba3c": ("ddrl.acting.ba3c", "BA3CActors", _check_ba3c),
    "a2c": ("ddrl.acting.a2c", "A2CActors", _check_a2c),
    "dqn": ("ddrl.acting.dqn", "DQNActors", _check_dqn),
}


def check_config(cfg: Config) -> None:
    ACTORS[cfg.acting.mode][2](cfg)


def actors_class(cfg: Config) -> type:
    """The actors for `acting.mode`, imported only when chosen."""
    module, name, _ = ACTORS[cfg.acting.mode]
    return getattr(importlib.import_module(module), name)


def make_actors(cfg: Config, learner: "Learner", rank: int, restart: int) -> "Actors":
    """Process `rank`'s actors: the rank's own, or with `sync.virtual_ranks` = k the k ranks
    rank x k ... rank x k + k - 1 of the job it rehearses."""
    cls, k = actors_class(cfg), cfg.sync.virtual_ranks
    if k == 1:
        return cls(cfg, learner, rank, restart)
    from ddrl.acting.virtual import VirtualRanks
    from ddrl.output import say

    # Each virtual rank's simulators are made, reset and decorrelated one rank after another:
    # at k = 64 that is minutes with nothing else on the terminal, which reads as a hang.
    started = time.monotonic()
    if rank == 0:
        say(f"[ddrl] starting the simulators of {k} virtual ranks a process")
    ranks = VirtualRanks([cls(cfg, learner, rank * k + i, restart) for i in range(k)])
    if rank == 0:
        say(f"[ddrl] the simulators of {k} virtual ranks started in "
            f"{time.monotonic() - started:.0f} s")
    return ranks
