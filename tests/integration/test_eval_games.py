"""The evaluation's games (ddrl/loop/evaluator.py `play_games`) on real CartPole simulators."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ddrl.config import load_config
from ddrl.loop.evaluator import MAX_EVAL_SIMS, play_games

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_the_actions_counted_are_those_of_the_games_counted():
    """More games than simulators: the simulators with the smaller share play on, uncounted,
    while the others finish theirs; only the counted games' moves are in the action counts."""
    cfg = load_config(JOBS / "cartpole.toml", ["eval.epsilon=0"])
    episodes = MAX_EVAL_SIMS + 4
    push_right = lambda step: np.tile([0.0, 1.0], (len(step.obs), 1))  # noqa: E731
    played = play_games(cfg, episodes, seed=7, scores=push_right)
    assert len(played.games) == episodes
    assert played.actions.tolist() == [0, sum(length for _, length in played.games)]
