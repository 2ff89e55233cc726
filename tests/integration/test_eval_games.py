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


def test_an_evaluation_stops_once_the_target_is_out_of_reach_and_plays_on_while_it_is_not():
    """Pushing right scores about 10 a game. Target 400 with at most 500 a game, 20 games: out
    of reach once 5 have ended, so the games stop with the first simulators' ends; target 5:
    in reach from the start, and every game is played."""
    from ddrl.loop.evaluator import out_of_reach

    push_right = lambda step: np.tile([0.0, 1.0], (len(step.obs), 1))  # noqa: E731
    episodes = MAX_EVAL_SIMS + 4
    for target, played_all in ((400, False), (5, True)):
        cfg = load_config(JOBS / "cartpole.toml", ["eval.epsilon=0", f"eval.target={target}",
                                                  "eval.max_return=500"])
        played = play_games(cfg, episodes, seed=7, scores=push_right,
                            give_up=out_of_reach(cfg, episodes))
        assert (len(played.games) == episodes) == played_all, len(played.games)
        assert len(played.games) >= 5


def test_an_evaluation_with_cores_of_its_own_plays_on_two_simulators_a_core():
    """While the ranks wait, an evaluation plays on 2 simulators per core: every game still
    counted, and a hopeless one cut after fewer steps than on the background's many."""
    from ddrl.loop.evaluator import out_of_reach

    cfg = load_config(JOBS / "cartpole.toml", ["eval.epsilon=0", "eval.target=400",
                                               "eval.max_return=500"])
    steps = {}
    seen: list[int] = []

    def push_right(step):
        seen.append(len(step.obs))
        return np.tile([0.0, 1.0], (len(step.obs), 1))
    for cores in (0, 2):
        seen.clear()
        played = play_games(cfg, 10, seed=7, scores=push_right, cores=cores)
        assert len(played.games) == 10 and max(seen) == (10 if cores == 0 else 4)
        seen.clear()
        play_games(cfg, 10, seed=7, scores=push_right, give_up=out_of_reach(cfg, 10),
                   cores=cores)
        steps[cores] = sum(seen)
    assert steps[2] < steps[0], steps


def test_a_pong_evaluation_out_of_reach_stops_on_the_points_lost_before_any_game_ends():
    """A policy that never moves loses every point. Target 18 over 10 games at most 21 each:
    out of reach once the 4 games going have lost 31 points in all, long before one of them
    has lost the 21 that end it. The cut reports those games as played to their end: -21."""
    from ddrl.loop.evaluator import evaluate, out_of_reach

    class Idle:
        recurrent = 0

        @staticmethod
        def predict(obs):
            return np.tile(np.eye(6)[0], (len(obs), 1)), None

    cfg = load_config(JOBS / "pong-ppo.toml", ["eval.max_return=21"])
    res = evaluate(cfg, Idle, 10, seed=7, give_up=out_of_reach(cfg, 10), cores=2)
    assert res.cut and res.episodes == 4, res
    assert res.mean == res.max == -21, res
