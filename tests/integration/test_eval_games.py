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


def test_an_evaluation_with_cores_of_its_own_plays_its_games_in_the_fewest_even_rounds():
    """While the ranks wait, an evaluation plays all its games at once up to PAUSED_SIMS
    simulators, more in even rounds (40 games: 2 rounds of 20), every game counted; in the
    background, on at most MAX_EVAL_SIMS."""
    from ddrl.loop.evaluator import PAUSED_SIMS

    cfg = load_config(JOBS / "cartpole.toml", ["eval.epsilon=0"])
    seen: list[int] = []

    def push_right(step):
        seen.append(len(step.obs))
        return np.tile([0.0, 1.0], (len(step.obs), 1))
    for episodes, cores, sims in ((10, 2, 10), (2 * PAUSED_SIMS, 2, PAUSED_SIMS),
                                  (2 * PAUSED_SIMS, 0, MAX_EVAL_SIMS)):
        seen.clear()
        played = play_games(cfg, episodes, seed=7, scores=push_right, cores=cores)
        assert len(played.games) == episodes and max(seen) == sims, (episodes, cores, seen)


def test_a_paused_pong_evaluation_plays_the_same_games_in_two_halves_as_in_one_batch():
    """Pipelined (one half of the simulators steps while the network acts on the other), the
    halves come back in whatever order the emulator's threads finish: a greedy policy's games,
    returns and lengths, are those of one batch for all. A policy of the screen, so that a
    step out of order would change them."""
    cfg = load_config(JOBS / "pong-ppo.toml", ["eval.epsilon=0"])
    weights = np.random.default_rng(0).standard_normal((64 * 64 * 4, 6))

    def screen_policy(step):
        return step.obs.reshape(len(step.obs), -1).astype(np.float64) @ weights
    games = {halves: sorted(play_games(cfg, 4, seed=7, scores=screen_policy, cores=2,
                                       halves=halves).games) for halves in (False, True)}
    assert games[True] == games[False] and len(games[True]) == 4, games


def test_a_pong_evaluation_out_of_reach_stops_on_the_points_lost_before_any_game_ends():
    """A policy that never moves loses every point. Target 18 over 10 games at most 21 each:
    out of reach once the 10 games going (all at once: the ranks wait) have lost 31 points in
    all, long before one of them has lost the 21 that end it. The cut reports those games as
    played to their end: -21."""
    from ddrl.loop.evaluator import evaluate, out_of_reach

    class Idle:
        recurrent = 0

        @staticmethod
        def predict(obs):
            return np.tile(np.eye(6)[0], (len(obs), 1)), None

    cfg = load_config(JOBS / "pong-ppo.toml", ["eval.max_return=21"])
    res = evaluate(cfg, Idle, 10, seed=7, give_up=out_of_reach(cfg, 10), cores=2)
    # A game lost 21-0 lasts about 760 agent steps. Each game that lost a point counts: those
    # the emulator's threads returned first may have lost them all (on busy cores one
    # game had none yet), and 31 points take at least two games going.
    assert res.cut and 2 <= res.episodes <= 10 and res.actions.sum() < 10 * 760 / 3, res
    assert res.mean == res.max == -21, res
    # The longest game is one of those going, cut short of the ~760 steps a whole one lasts.
    assert 0 < res.longest < 760, res


def test_kept_simulators_restarted_play_the_games_new_ones_would_after_a_cut_mid_game():
    """The evaluator keeps its simulators from one evaluation to the next (making ALE's costs
    about a second). Restarted with the next evaluation's seed after one cut with steps in
    flight (Pong in two pipelined halves) or after whole games (CartPole), they play what new
    simulators with that seed play: returns and lengths, game for game (in the order the
    halves end)."""
    from ddrl.loop.evaluator import Pools

    weights = np.random.default_rng(0).standard_normal((64 * 64 * 4, 6))

    def screen_policy(step):
        return step.obs.reshape(len(step.obs), -1).astype(np.float64) @ weights

    push_right = lambda step: np.tile([0.0, 1.0], (len(step.obs), 1))  # noqa: E731
    for job, scores, cut in (("pong-ppo.toml", screen_policy, lambda games, lost: lost >= 3),
                             ("cartpole.toml", push_right, None)):
        cfg = load_config(JOBS / job, ["eval.epsilon=0"])
        pools = Pools()
        try:
            first = play_games(cfg, 4, seed=7, scores=scores, give_up=cut, cores=2, pools=pools)
            assert first.cut == (cut is not None)
            kept = play_games(cfg, 4, seed=8, scores=scores, cores=2, pools=pools)
        finally:
            pools.close()
        new = play_games(cfg, 4, seed=8, scores=scores, cores=2)
        assert sorted(kept.games) == sorted(new.games) and len(new.games) == 4, (job, kept, new)


def test_an_evaluation_reports_its_longest_game_and_a_confirmation_the_longest_of_all():
    """/eval's `longest`: what an evaluation's wait was made of."""
    from ddrl.loop.evaluator import evaluate, pooled

    class PushRight:
        recurrent = 0

        @staticmethod
        def predict(obs):
            return np.tile([0.0, 1.0], (len(obs), 1)), None

    cfg = load_config(JOBS / "cartpole.toml", ["eval.epsilon=0"])
    played = play_games(cfg, 6, seed=7, scores=lambda step: PushRight.predict(step.obs)[0])
    res = evaluate(cfg, PushRight, 6, seed=7)
    assert res.longest == max(length for _, length in played.games) > 0, (res, played.games)
    other = evaluate(cfg, PushRight, 6, seed=8)
    assert pooled(res, other).longest == max(res.longest, other.longest)
