"""The frame cap is truncation, not termination: real ALE and CartPole simulators report it,
and the node bootstraps the cut value chain from the critic's value of the last observation."""
from __future__ import annotations

import numpy as np
import pytest

from ddrl.acting.base import Actors
from ddrl.config import load_config
from ddrl.envs import env_spec, make_pool
from ddrl.learner import Learner


def run_until_done(pool, steps: int):
    for _ in range(steps):
        step = pool.recv()
        if step.done.any():
            return step
        pool.send(np.zeros(len(step.env_ids), np.int32))
    raise AssertionError("no simulator finished")


@pytest.mark.parametrize("job, cap", [("jobs/pong-ppo.toml", 400), ("jobs/cartpole.toml", 0)])
def test_truncated_games_bring_their_last_observation(job, cap):
    sets = ["env.decorrelate=0"] + ([f"env.max_episode_frames={cap}"] if cap else [])
    cfg = load_config(job, sets)
    pool = make_pool(cfg, 3, seed=1, train=True)
    try:
        if cap:  # Pong with a 400-frame cap: every game is cut at agent step 100
            step = run_until_done(pool, 200)
            assert step.truncated.all() and step.done.all()
            assert step.final_obs.shape == (3, *step.obs.shape[1:])
            assert (step.final_obs != step.obs).any(axis=tuple(range(1, step.obs.ndim))).all()
        else:  # CartPole pushed one way falls over: terminated, not truncated
            step = run_until_done(pool, 600)
            assert not step.truncated.any() and step.final_obs is None
    finally:
        pool.close()


def test_node_adds_the_discounted_value_of_the_last_observation():
    cfg = load_config("jobs/pong-ppo.toml", ["env.decorrelate=0", "env.max_episode_frames=400"])
    learner = Learner(cfg, *env_spec(cfg))
    node = Actors(cfg, learner, rank=0, restart=0)
    pool = make_pool(cfg, 2, seed=2, train=True)
    try:
        step = run_until_done(pool, 200)
    finally:
        pool.close()
    step.truncated[1] = False  # one simulator as if its game had really ended
    step.final_obs = step.final_obs[:1]
    reward = node.bootstrap_truncated(step)
    value = learner.predict(step.final_obs)[1][0]
    np.testing.assert_allclose(reward, step.reward + np.array([cfg.algo.gamma * value, 0.0]),
                               rtol=1e-6)
    order = np.array([1, 0])
    step.reorder(order)
    assert step.truncated.tolist() == [False, True] and len(step.final_obs) == 1
