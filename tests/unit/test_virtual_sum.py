"""The virtual ranks' gradient sum rounds as a recursive-doubling all-reduce would, and the
job's ranks (virtual ones included) divide it and scale the learning rate."""
from __future__ import annotations

import numpy as np
import pytest

from ddrl.config import load_config
from ddrl.distributed.sync import LocalSync, TreeSum
from ddrl.distributed.world import World
from ddrl.optim import scheduled_lr
from ddrl.placement import trainer_ranks


def recursive_doubling(parts: list[np.ndarray]) -> np.ndarray:
    """Each round, rank i takes the partial sum of rank i xor 2^round (power-of-two ranks)."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def float32_parts(k: int) -> list[np.ndarray]:
    rng = np.random.default_rng(k)
    # Magnitudes far apart: additions in another order round differently.
    return [(rng.standard_normal(1000) * 10.0 ** rng.integers(-4, 5, 1000)).astype(np.float32)
            for _ in range(k)]


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_the_tree_sum_is_the_recursive_doubling_sum_bit_for_bit(k):
    parts = float32_parts(k)
    tree = TreeSum()
    for p in parts:
        tree.add(p)
    assert np.array_equal(tree.total(), recursive_doubling(parts))


def test_the_order_matters_so_the_test_above_can_fail():
    parts = float32_parts(8)
    assert not np.array_equal(sum(parts[1:], parts[0].copy()), recursive_doubling(parts))


def test_a_tree_of_three_sums_every_part():
    parts = float32_parts(3)
    tree = TreeSum()
    for p in parts:
        tree.add(p)
    np.testing.assert_allclose(tree.total(), parts[0] + parts[1] + parts[2], rtol=1e-6)


def test_one_rank_passes_its_gradient_through_and_virtual_ranks_divide_by_the_job():
    grad = np.arange(4, dtype=np.float32)
    assert LocalSync(World()).update(grad, np.zeros(1)).update.gradient is grad
    res = LocalSync(World(), virtual=4).update(grad * 4, np.zeros(1))
    assert res.contributors == 4 and np.array_equal(res.update.gradient, grad)


def test_the_learning_rate_scales_with_the_virtual_ranks_too():
    cfg = load_config(None, ["sync.virtual_ranks=8"])
    assert trainer_ranks(cfg, 2) == 16


def test_warm_up_rises_linearly_then_holds_and_the_schedule_follows():
    o = load_config(None, ["optim.warmup_frames=1000"]).optim
    assert scheduled_lr(o, 1.0, 0.0, 0) == 0.0
    assert scheduled_lr(o, 1.0, 0.0, 250) == 0.25
    assert scheduled_lr(o, 1.0, 0.5, 5000) == 1.0
    o.lr_schedule = "linear"
    assert scheduled_lr(o, 1.0, 0.5, 5000) == 0.5
