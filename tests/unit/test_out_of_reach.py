"""When an evaluation gives up (ddrl/loop/evaluator.py `out_of_reach`): exactly when even the
best score in every game left could not bring the mean to the target."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddrl.config import load_config
from ddrl.errors import DdrlError
from ddrl.loop.evaluator import EvalResult, out_of_reach, whole_games

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def cfg(*sets: str):
    return load_config(JOBS / "pong-ppo.toml", list(sets))


def test_a_pong_evaluation_of_ten_games_gives_up_after_one_game_below_minus_nine():
    # 18 x 10 = 180 needed; 9 games at 21 bring 189: the first game may score -9, not -10.
    hopeless = out_of_reach(cfg("eval.max_return=21"), 10)
    assert not hopeless([]) and not hopeless([-9.0]) and hopeless([-10.0])
    assert not hopeless([21.0] * 9) and hopeless([17.0] * 10)


def test_the_points_lost_in_games_still_going_count_against_the_target():
    # 10 games at 21 bring 210, 30 above the 180 needed: 30 points lost leave it in reach.
    hopeless = out_of_reach(cfg("eval.max_return=21"), 10)
    assert not hopeless([], 30.0) and hopeless([], 31.0)
    assert not hopeless([19.0], 28.0) and hopeless([19.0], 29.0)


def test_a_confirmation_counts_the_games_its_weights_played_before():
    prior = EvalResult(mean=19.0, std=0.0, max=19.0, episodes=10)  # 190 of the 900 needed
    hopeless = out_of_reach(cfg("eval.max_return=21"), 40, prior)
    # 3 games at -21 leave 190 - 63 + 21 x 37 = 904 >= 900 within reach; 4 leave 862.
    assert not hopeless([-21.0] * 3) and hopeless([-21.0] * 4)


def test_without_a_bound_or_a_target_every_game_is_played():
    assert out_of_reach(cfg("eval.max_return=none"), 10) is None
    assert out_of_reach(cfg("eval.max_return=21", "eval.target=none"), 10) is None


def test_a_bound_below_the_target_is_refused():
    with pytest.raises(DdrlError, match="eval.max_return: 17 is below eval.target 18"):
        cfg("eval.max_return=17")


def test_games_cut_before_their_end_are_reported_as_played_to_the_end_at_the_same_rate():
    # 3-8: the opponent ahead, 21 x -5 / 8; 5-4: 21 x 1 / 5; 0-0 says nothing; not going: not counted.
    games = whole_games(np.array([3.0, 5.0, 0.0, 9.0]), np.array([8.0, 4.0, 0.0, 1.0]),
                        np.array([800, 700, 10, 900]), np.array([True, True, True, False]), 21.0)
    assert games == [(-13.125, 800), (4.2, 700)]
