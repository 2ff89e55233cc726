"""Prioritized replay, Categorical DQN and value rescaling against their textbook definitions."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from replay_streams import SIDE, STACK, FakeStream

from ddrl.acting.prioritized import PRIORITY_EPS, PrioritizedReplay, SumTree
from ddrl.algos.dqn import DQN, project, rescale, unrescale
from ddrl.config import Config, ModelConfig
from ddrl.models import build_model
from ddrl.rundir import checkpoint


def test_sum_tree_draws_each_leaf_in_proportion_to_its_value():
    rng = np.random.default_rng(0)
    values = rng.random(37) * (rng.random(37) < 0.7)
    tree = SumTree(37)
    tree.set(np.arange(37), values)
    assert tree.total == pytest.approx(values.sum())
    draws = 400_000
    leaves = tree.find(rng.random(draws) * tree.total)
    counts = np.bincount(leaves, minlength=37)
    assert counts[values == 0].sum() == 0
    expected = draws * values / values.sum()
    # Binomial standard deviations: 5 of them is a one-in-millions miss per leaf.
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected + 1))


def test_sum_tree_keeps_exact_sums_through_many_updates_and_a_rebuild():
    rng = np.random.default_rng(1)
    tree = SumTree(1000)
    for _ in range(200):
        index = rng.integers(0, 1000, 50)
        tree.set(index, rng.random(50))
    values = tree.values.copy()
    assert tree.total == pytest.approx(values.sum(), rel=1e-12)
    # The largest mass lands on the last leaf with mass, never past it onto an empty one.
    last = np.flatnonzero(values)[-1]
    assert tree.find(np.array([np.nextafter(tree.total, 0)]))[0] == last
    tree.tree[1:tree.leaves] = 0
    tree.rebuild()
    assert tree.total == pytest.approx(values.sum(), rel=1e-12)


def prioritized_memory(capacity: int, streams: int, steps: int, n: int, alpha: float = 0.5,
                       seed: int = 0) -> PrioritizedReplay:
    rng = np.random.default_rng(seed)
    sims = [FakeStream(rng, 10**6 * (j + 1)) for j in range(streams)]
    memory = PrioritizedReplay(capacity, streams, (STACK, SIDE, SIDE), np.dtype(np.int32),
                               stacked=True, n=n, alpha=alpha, beta=0.4)
    memory.begin(np.arange(streams), np.stack([s.obs for s in sims]))
    for t in range(steps):
        out = [s.step() for s in sims]
        memory.add(np.arange(streams), np.array([o[0] for o in out]),
                   np.array([o[1] for o in out], np.float32), np.array([o[2] for o in out]),
                   np.full(streams, t), np.stack([o[4] for o in out]))
    return memory


def uniform_candidates(memory: PrioritizedReplay) -> set[int]:
    """Every slot the uniform sampler can return, from its own rule."""
    found = set()
    for s, head in enumerate(memory.head):
        low = max(head - memory.slots + memory.stack - 1, 0)
        for p in range(low, head - memory.n):
            if memory.acted[s, p % memory.slots]:
                found.add(s * memory.slots + p % memory.slots)
    return found


@pytest.mark.parametrize("capacity,steps", [(4000, 300), (400, 500), (120, 1000)])
def test_priorities_cover_exactly_what_the_uniform_sampler_may_draw(capacity, steps):
    memory = prioritized_memory(capacity, 3, steps, n=3)
    live = set(np.flatnonzero(memory.tree.values).tolist())
    assert live == uniform_candidates(memory)
    assert memory.valid == len(live)
    sample = memory.sample(512, 3, np.random.default_rng(2))
    assert set(sample.index.tolist()) <= live
    # The observation and action sampled are the slot's own.
    s, slot = np.divmod(sample.index, memory.slots)
    assert np.array_equal(sample.actions, memory.actions[s, slot])
    assert np.array_equal(sample.obs[:, -1], memory.frames[s, slot])


def test_sampling_follows_priorities_and_weights_undo_it():
    alpha, beta = 0.7, 0.5
    memory = prioritized_memory(4000, 2, 200, n=1, alpha=alpha)
    memory.beta = beta
    live = np.flatnonzero(memory.tree.values)
    rng = np.random.default_rng(3)
    errors = rng.random(len(live)) * 3
    memory.update(live, errors)
    priority = (errors + PRIORITY_EPS) ** alpha
    counts = np.zeros(memory.tree.size)
    for _ in range(200):
        sample = memory.sample(256, 1, rng)
        np.add.at(counts, sample.index, 1)
    expected = counts.sum() * priority / priority.sum()
    assert np.all(np.abs(counts[live] - expected) <= 5 * np.sqrt(expected + 1))
    # w_i = (N P(i))^-beta / max_j w_j over the batch.
    p = memory.tree.get(sample.index) / memory.tree.total
    w = (len(live) * p) ** -beta
    assert np.allclose(sample.weights, w / w.max(), rtol=1e-5)
    assert sample.weights.max() == 1.0
    memory.anneal(0.5)
    assert memory.beta == pytest.approx(0.7)
    memory.anneal(2.0)
    assert memory.beta == 1.0


def test_new_transitions_enter_with_the_largest_priority_seen():
    memory = prioritized_memory(4000, 1, 50, n=2, alpha=1.0)
    live = np.flatnonzero(memory.tree.values)
    memory.update(live, np.full(len(live), 0.1))
    memory.update(live[:1], np.array([7.0]))
    rng = np.random.default_rng(4)
    sims = [FakeStream(rng, 10**7)]
    memory.begin(np.arange(1), np.stack([s.obs for s in sims]))
    for t in range(10):
        a, r, d, _, after = sims[0].step()
        memory.add(np.arange(1), np.array([a]), np.array([r], np.float32), np.array([d]),
                   np.array([t]), after[None])
    fresh = sorted(set(np.flatnonzero(memory.tree.values)) - set(live))
    assert len(fresh) >= 1
    assert np.allclose(memory.tree.get(np.array(fresh)), 7.0 + PRIORITY_EPS)


def test_a_non_finite_error_never_poisons_the_tree():
    """A NaN leaf made the total NaN: every draw was then slot 0 with NaN weights."""
    memory = prioritized_memory(4000, 2, 100, n=1)
    live = np.flatnonzero(memory.tree.values)
    memory.update(live, np.linspace(0.1, 2.0, len(live)))
    memory.update(live[:3], np.array([np.nan, np.inf, -np.inf]))
    assert np.isfinite(memory.tree.total) and np.isfinite(memory.max_priority)
    assert np.allclose(memory.tree.get(live[:3]), memory.max_priority ** memory.alpha)
    sample = memory.sample(256, 1, np.random.default_rng(5))
    assert np.isfinite(sample.weights).all()
    assert len(set(sample.index.tolist())) > 100  # not every draw the same slot


def test_a_saved_memory_with_non_finite_priorities_is_mended_on_restore(tmp_path):
    memory = prioritized_memory(4000, 2, 100, n=1)
    state = memory.state()
    state["priorities"] = state["priorities"].copy()
    state["priorities"][np.flatnonzero(state["priorities"])[:2]] = np.nan
    state["max_priority"] = np.float64(np.nan)
    fresh = prioritized_memory(4000, 2, 0, n=1)
    fresh.restore(state, 1)
    assert np.isfinite(fresh.tree.total) and fresh.max_priority == 1.0


def test_priorities_are_saved_and_restored_with_the_memory(tmp_path):
    memory = prioritized_memory(400, 2, 300, n=3)
    live = np.flatnonzero(memory.tree.values)
    memory.update(live, np.linspace(0.1, 2.0, len(live)))
    checkpoint.write_arrays(tmp_path / "replay.npz", memory.state())
    restored = PrioritizedReplay(400, 2, (STACK, SIDE, SIDE), np.dtype(np.int32), stacked=True,
                                 n=3, alpha=0.5, beta=0.4)
    restored.restore(checkpoint.read_arrays(tmp_path / "replay.npz"), 3)
    kept = np.flatnonzero(restored.tree.values)
    # The restore drops each stream's last transitions, whose n steps would run into the new
    # games; they had no priority yet (their n successors were not all there).
    assert np.array_equal(kept, live)
    assert np.array_equal(restored.tree.values[kept], memory.tree.values[kept])
    assert restored.valid == len(kept) and restored.max_priority == memory.max_priority
    uniform_file = {k: v for k, v in memory.state().items() if k != "priorities"}
    with pytest.raises(ValueError, match="priorities"):
        restored.restore(uniform_file, 3)


def reference_projection(probs, shifted, support):
    """Bellemare et al. (2017), Algorithm 1, one atom at a time."""
    v_min, v_max, k = support[0], support[-1], len(support)
    dz = (v_max - v_min) / (k - 1)
    out = np.zeros_like(probs)
    for b in range(len(probs)):
        for j in range(k):
            tz = min(max(shifted[b, j], v_min), v_max)
            pos = (tz - v_min) / dz
            lo, hi = int(np.floor(pos)), int(np.ceil(pos))
            if lo == hi:
                out[b, lo] += probs[b, j]
            else:
                out[b, lo] += probs[b, j] * (hi - pos)
                out[b, hi] += probs[b, j] * (pos - lo)
    return out


def test_categorical_projection_matches_the_papers_algorithm():
    rng = np.random.default_rng(5)
    support = np.linspace(-10, 10, 51)
    probs = rng.dirichlet(np.ones(51), 64)
    reward = rng.normal(0, 4, 64)
    discount = rng.choice([0.0, 0.99 ** 3], 64)
    shifted = reward[:, None] + discount[:, None] * support[None, :]
    shifted[0] = support  # exactly on the atoms
    out = project(probs, shifted, support)
    assert np.allclose(out, reference_projection(probs, shifted, support), atol=1e-12)
    assert np.allclose(out.sum(-1), 1.0)
    # The mean moves as the Bellman update moves it, where nothing was clipped.
    inside = (shifted.min(-1) >= -10) & (shifted.max(-1) <= 10)
    assert np.allclose((out @ support)[inside], (probs * shifted).sum(-1)[inside])


def test_rescaling_and_its_inverse():
    x = np.concatenate([np.linspace(-1e4, 1e4, 2001), [0.0, 1e-6, -3.5]])
    assert np.allclose(unrescale(rescale(x)), x, rtol=1e-9, atol=1e-8)
    assert rescale(np.array([3.0]))[0] == pytest.approx(1.0 + 3e-3)
    assert np.all(np.diff(rescale(np.sort(x))) >= 0)


def categorical_cfg(dueling: bool) -> Config:
    cfg = Config()
    cfg.algo.name, cfg.acting.mode = "dqn", "dqn"
    cfg.dqn.atoms, cfg.dqn.v_min, cfg.dqn.v_max, cfg.dqn.dueling = 11, -5.0, 5.0, dueling
    cfg.dqn.double, cfg.dqn.n_step = True, 2
    return cfg


@pytest.mark.parametrize("dueling", [False, True])
def test_categorical_head_gives_distributions_whose_means_are_the_q_values(dueling):
    algo = DQN(categorical_cfg(dueling))
    model = build_model(ModelConfig(arch="mlp", hidden=[16]), (4,), 3, algo.head, algo.support)
    q, log_p = (t.numpy() for t in model(np.random.default_rng(6).normal(size=(5, 4)).astype(np.float32)))
    assert log_p.shape == (5, 3, 11)
    assert np.allclose(np.exp(log_p).sum(-1), 1.0, atol=1e-5)
    assert np.allclose(q, (np.exp(log_p) * algo.support).sum(-1), atol=1e-5)


def test_categorical_targets_and_loss():
    """The target is the projection of the target network's distribution at the online
    network's argmax (double), shifted by the n-step return; the loss is its cross-entropy."""
    algo = DQN(categorical_cfg(False))
    rng = np.random.default_rng(7)
    b, a, k = 6, 3, 11
    logits = rng.normal(size=(b, a, k))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q_target = (np.exp(log_p) * algo.support).sum(-1)
    q_online = rng.normal(size=(b, a))
    rewards = rng.normal(size=(2, b)).astype(np.float32)
    dones = np.zeros((2, b), np.float32)
    dones[0, 0] = 1.0
    m = algo.replay_targets(rewards, dones, (q_target, log_p), q_online)["distribution"]
    gamma = Config().algo.gamma
    for i in range(b):
        chosen = q_online[i].argmax()
        if i == 0:
            reward, discount = rewards[0, 0], 0.0
        else:
            reward, discount = rewards[0, i] + gamma * rewards[1, i], gamma ** 2
        expect = reference_projection(np.exp(log_p[i, chosen])[None],
                                      reward + discount * algo.support[None], algo.support)[0]
        assert np.allclose(m[i], expect, atol=1e-6)
    actions = rng.integers(0, a, b)
    weights = rng.random(b).astype(np.float32)
    loss, stats = algo.loss(tf.constant(q_target, tf.float32), tf.constant(log_p, tf.float32),
                            tf.constant(actions), {"distribution": tf.constant(m, tf.float32),
                                                   "weights": tf.constant(weights)})
    ce = -(m * log_p[np.arange(b), actions]).sum(-1)
    assert np.allclose(stats["per_sample"].numpy(), ce, rtol=1e-5)
    assert float(loss) == pytest.approx(float((weights * ce).mean()), rel=1e-5)


def test_rescaled_targets_bootstrap_through_the_inverse():
    cfg = Config()
    cfg.dqn.value_rescale = True
    algo = DQN(cfg)
    q = np.array([[rescale(np.array(50.0)), 0.0]])
    rewards, dones = np.array([[2.0]], np.float32), np.zeros((1, 1), np.float32)
    returns = algo.replay_targets(rewards, dones, (q, q.max(-1)), q)["returns"]
    assert returns[0] == pytest.approx(rescale(2.0 + cfg.algo.gamma * 50.0), rel=1e-6)
    assert algo.state_value(q)[0] == pytest.approx(50.0, rel=1e-6)
