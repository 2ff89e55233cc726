"""`sync.virtual_fused`: one gradient call for a process's virtual ranks gives the sum of the
ranks' own gradients (each loss over its own minibatch) within float rounding, for each
algorithm family, and hands each rank its own per-sample figures."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from ddrl.algos.batch import Batch
from ddrl.config import load_config
from ddrl.distributed.sync import TreeSum
from ddrl.envs import env_spec
from ddrl.errors import DdrlError
from ddrl.learner import Learner
from ddrl.placement import check_config

JOBS = Path(__file__).resolve().parents[2] / "jobs"
K, N = 4, 6
FAMILIES = {
    "a2c": ("cartpole.toml", "acting.mode=a2c"),
    "ppo": ("cartpole.toml", "acting.mode=a2c", "algo.name=ppo"),
    "vtrace": ("cartpole.toml", "acting.mode=a2c", "algo.name=vtrace"),
    "dqn-categorical": ("cartpole-dqn.toml", "dqn.atoms=11", "dqn.v_min=0", "dqn.v_max=100"),
}


def learner_and_parts(family: str) -> tuple[Learner, list[Batch]]:
    job, *sets = FAMILIES[family]
    cfg = load_config(JOBS / job, [*sets, f"sync.virtual_ranks={K}", "sync.virtual_fused=true",
                                   "optim.clip_scope=sync", "acting.threads=1"])
    obs_shape, dtype, n_actions = env_spec(cfg)
    # Seeded weights, as a run's (ddrl/cpus.py): unseeded, an a2c loss that came out near 0
    # (its terms cancelling) now and then failed a check relative to it alone.
    tf.keras.utils.set_random_seed(0)
    learner = Learner(cfg, obs_shape, dtype, n_actions)
    rng = np.random.default_rng(0)

    def target(field: str) -> np.ndarray:
        shape = (N, *learner.algo.target_shapes.get(field, ()))
        if field == "distribution":
            p = rng.random(shape)
            return (p / p.sum(-1, keepdims=True)).astype(np.float32)
        x = rng.standard_normal(shape).astype(np.float32)
        return -np.abs(x) if field == "logp" else np.abs(x) if field == "weights" else x

    # Ranks of different scales: a per-rank normalisation or mean shows in the sum.
    parts = [Batch((rng.standard_normal((N, *obs_shape)) * (1 + r)).astype(dtype),
                   rng.integers(0, n_actions, N), np.zeros(N, np.int64),
                   {f: target(f) * (1 + 3 * r) for f in learner.algo.fields}) for r in range(K)]
    return learner, parts


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_call_gives_the_sum_of_the_ranks_gradients(family):
    learner, parts = learner_and_parts(family)
    assert learner.fuses
    fused, stats, per_sample = learner.fused_gradients(parts)
    fused = fused.copy()
    tree, one_by_one = TreeSum(), []
    for part in parts:
        grad, part_stats, figures = learner.gradients(part)
        tree.add(grad.copy())
        one_by_one.append((part_stats, figures))
    total = tree.total()
    scale = np.abs(total).max()
    np.testing.assert_allclose(fused, total, rtol=1e-5, atol=1e-6 * scale)
    assert stats["loss"] == pytest.approx(one_by_one[0][0]["loss"], rel=1e-5, abs=1e-6)
    for figures, (_, expected) in zip(per_sample, one_by_one):
        if expected is None:
            assert figures is None
        else:
            np.testing.assert_allclose(figures, expected, rtol=1e-5)


def test_each_rank_normalises_its_own_advantages():
    """PPO standardises advantages per rank's minibatch: the fused call must too, so it is
    not one gradient on all the ranks' samples taken as one rank's (which a plain batched
    call would be)."""
    learner, parts = learner_and_parts("ppo")
    fused = learner.fused_gradients(parts)[0].copy()
    whole = Batch(*(np.concatenate([getattr(p, a) for p in parts])
                    for a in ("obs", "actions", "acted_at")),
                  {f: np.concatenate([p.targets[f] for p in parts]) for f in learner.algo.fields})
    as_one = learner.gradients(whole)[0] * K
    assert not np.allclose(as_one, fused, rtol=1e-2, atol=1e-2 * np.abs(fused).max())


def test_each_ranks_own_clip_is_refused():
    cfg = load_config(JOBS / "cartpole.toml", ["sync.virtual_ranks=2", "sync.virtual_fused=true",
                                                "optim.max_grad_norm=0.5"])
    with pytest.raises(DdrlError, match="sync.virtual_fused.*clip_scope"):
        check_config(cfg)


def test_a_rehearsal_says_it_is_starting_its_virtual_ranks_simulators(capsys):
    """Making many virtual ranks' simulators takes minutes before the first update: rank 0
    says so and how long it took, so the wait is not taken for a hang."""
    from ddrl.acting import make_actors

    cfg = load_config(JOBS / "cartpole.toml", ["sync.virtual_ranks=2", "acting.mode=a2c",
                                               "acting.threads=1"])
    learner = Learner(cfg, *env_spec(cfg))
    make_actors(cfg, learner, 0, 0).close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[ddrl] starting the simulators of 2 virtual ranks a process"
    assert re.fullmatch(r"\[ddrl\] the simulators of 2 virtual ranks started in \d+ s", lines[1])
    make_actors(cfg, learner, 1, 0).close()
    assert capsys.readouterr().out == ""
