"""The learner's view of the actors' simulators (RemotePool), without MPI: which simulator a
step belongs to."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ddrl.config import load_config
from ddrl.distributed.central import RemotePool, _Request

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def a_step(actor: int, group: int, n_sim: int):
    meta = {"reward": np.zeros(n_sim), "done": np.zeros(n_sim), "truncated_mask": np.zeros(n_sim),
            "games_env": np.array([1.0]), "games_return": np.array([5.0]),
            "games_length": np.array([10.0])}
    return (_Request(actor, group, np.arange(n_sim)), meta, np.zeros((n_sim, 4), np.float32), None)


def test_each_group_of_each_actor_is_simulators_of_its_own():
    """Two groups of one actor both number their simulators 0..n_sim-1: the learner must not
    assemble one unroll from two games."""
    cfg = load_config(JOBS / "cartpole.toml", ["sync.mode=central", "central.groups=2",
                                               "acting.n_sim=3"])
    pool = RemotePool(cfg, comm=None, actors=2, obs_shape=(4,), obs_dtype=np.float32,
                      n_actions=2, frames_per_step=1)
    assert pool.num_envs == 2 * 2 * 3
    parts = [a_step(actor, group, 3) for actor in (0, 1) for group in (0, 1)]
    step = pool._step(parts)
    assert sorted(step.env_ids.tolist()) == list(range(12))
    assert sorted(env for env, _, _ in step.episodes) == [1, 4, 7, 10]
