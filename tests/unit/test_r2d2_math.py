"""R2D2's parts against their definitions: the recurrent network's resets and unrolls, the
memory of sequences, burn-in, the sequences' n-step targets and priorities."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from replay_streams import SIDE, STACK, FakeStream

from ddrl.acting.policy import RecurrentState
from ddrl.acting.prioritized import PRIORITY_EPS
from ddrl.acting.sequences import PrioritizedSequences, SequenceReplay
from ddrl.algos.dqn import rescale, unrescale
from ddrl.algos.r2d2 import R2D2, sequence_priority
from ddrl.config import Config, ModelConfig
from ddrl.models import build_model
from ddrl.rundir import checkpoint

UNITS = 8


def recurrent_model(obs_dim: int = 4, actions: int = 3, head: str = "dueling"):
    return build_model(ModelConfig(arch="mlp", hidden=[16]), (obs_dim,), actions, head, None,
                       recurrent=UNITS)


def zeros(batch: int) -> np.ndarray:
    return np.zeros((batch, UNITS), np.float32)


def test_a_game_start_zeroes_the_state_and_unrolls_compose():
    model = recurrent_model()
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 7, 4)).astype(np.float32)
    starts = np.zeros((3, 7), np.float32)
    full = model([obs, starts, zeros(3), zeros(3)])[0].numpy()
    # Steps from a start on are those of a fresh unroll from that step.
    starts[:, 4] = 1
    restarted = model([obs, starts, zeros(3), zeros(3)])[0].numpy()
    fresh = model([obs[:, 4:], starts[:, 4:] * 0, zeros(3), zeros(3)])[0].numpy()
    np.testing.assert_allclose(restarted[:, 4:], fresh, atol=1e-6)
    np.testing.assert_allclose(restarted[:, :4], full[:, :4], atol=1e-6)
    assert np.abs(restarted[:, 4:] - full[:, 4:]).max() > 1e-4
    # Two unrolls, the second from the first's final state, are one unroll.
    starts[:] = 0
    q1, _, h, c = model([obs[:, :3], starts[:, :3], zeros(3), zeros(3)])
    q2 = model([obs[:, 3:], starts[:, 3:], h, c])[0]
    np.testing.assert_allclose(np.concatenate([q1, q2], 1), full, atol=1e-5)


def test_acting_one_step_at_a_time_is_the_unroll():
    model = recurrent_model()
    predict = lambda *x: tuple(o.numpy() for o in model(list(x)))  # noqa: E731
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(2, 5, 4)).astype(np.float32)
    starts = np.zeros((2, 5), bool)
    starts[1, 3] = True
    unrolled = model([obs, starts.astype(np.float32), zeros(2), zeros(2)])[0].numpy()
    state = RecurrentState(2, UNITS)
    for t in range(5):
        before = state.state()
        peeked = state.peek(predict, obs[:, t], np.array([True, True]))[0]
        assert np.array_equal(state.state(), before)  # peek leaves the state as it was
        q, _ = state.step(predict, obs[:, t], starts[:, t])
        if not starts[:, t].any():
            np.testing.assert_allclose(peeked, q, atol=1e-6)
        np.testing.assert_allclose(q, unrolled[:, t], atol=1e-5)


def r2d2_config(**dqn) -> Config:
    cfg = Config()
    cfg.algo.name = cfg.acting.mode = "dqn"
    cfg.dqn.recurrent, cfg.dqn.double = UNITS, True
    for key, value in dqn.items():
        setattr(cfg.dqn, key, value)
    return cfg


def test_burn_in_refreshes_the_state_without_gradient():
    cfg = r2d2_config(burn_in=3, sequence=4, n_step=2)
    algo = R2D2(cfg)
    model = recurrent_model(actions=2)
    rng = np.random.default_rng(2)
    obs = tf.constant(rng.normal(size=(5, 7, 4)).astype(np.float32))
    targets = {"returns": tf.constant(rng.normal(size=(5, 4)).astype(np.float32)),
               "weights": tf.ones(5), "starts": tf.zeros((5, 7)),
               "state": tf.constant(rng.normal(size=(5, 2, UNITS)).astype(np.float32))}
    actions = tf.constant(rng.integers(0, 2, (5, 4)).astype(np.int32))
    with tf.GradientTape() as tape:
        tape.watch(obs)
        q, _ = algo.forward(model, obs, targets, training=True)
        loss, stats = algo.loss(q, None, actions, targets)
    grad = tape.gradient(loss, obs).numpy()
    assert q.shape == (5, 4, 2)
    assert np.all(grad[:, :3] == 0) and np.abs(grad[:, 3:]).min(axis=-1).max() > 0
    # The learned steps are the unroll from the burned-in state.
    state = targets["state"].numpy()
    _, _, h, c = model([obs[:, :3], targets["starts"][:, :3], state[:, 0], state[:, 1]])
    np.testing.assert_allclose(q, model([obs[:, 3:], targets["starts"][:, 3:], h, c])[0],
                               atol=1e-5)
    # The loss: Huber's over the learned steps, the priority R2D2's mix of max and mean.
    error = np.take_along_axis(q.numpy(), actions.numpy()[..., None], -1)[..., 0] \
        - targets["returns"].numpy()
    huber = np.where(np.abs(error) <= 1, 0.5 * error ** 2, np.abs(error) - 0.5)
    assert float(loss) == pytest.approx(huber.mean(), rel=1e-5)
    np.testing.assert_allclose(stats["per_sample"], 0.9 * np.abs(error).max(1)
                               + 0.1 * np.abs(error).mean(1), rtol=1e-5)


def test_sequence_priority_mixes_max_and_mean():
    errors = np.array([[0.0, 1.0, -3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_allclose(sequence_priority(errors, 0.9), [0.9 * 3 + 0.1 * 1, 2.0])
    np.testing.assert_allclose(sequence_priority(tf.constant(errors), 0.9),
                               sequence_priority(errors, 0.9))
    assert sequence_priority(errors, 0.0)[0] == pytest.approx(1.0)


@pytest.mark.parametrize("value_rescale", [False, True])
def test_sequence_targets_are_each_steps_n_step_double_q_return(value_rescale):
    burn, length, n, gamma = 2, 5, 3, 0.9
    cfg = r2d2_config(burn_in=burn, sequence=length, n_step=n, value_rescale=value_rescale)
    cfg.algo.gamma = gamma
    algo = R2D2(cfg)
    rng = np.random.default_rng(3)
    span = burn + length + n
    rewards = rng.normal(size=(4, span)).astype(np.float32)
    dones = (rng.random((4, span)) < 0.2).astype(np.float32)
    q_target, q_online = rng.normal(size=(2, 4, span, 2)).astype(np.float32)
    got = algo.sequence_targets(rewards, dones, q_target, q_online)["returns"]
    assert got.shape == (4, length)
    h_inv = unrescale if value_rescale else (lambda x: x)
    h = rescale if value_rescale else (lambda x: x)
    for b in range(4):
        for i in range(length):
            t = burn + i
            ret, discount = 0.0, 1.0
            for k in range(n):
                ret += discount * rewards[b, t + k]
                discount *= gamma
                if dones[b, t + k]:
                    discount = 0.0
                    break
            later = t + n
            bootstrap = h_inv(q_target[b, later, q_online[b, later].argmax()])
            assert got[b, i] == pytest.approx(h(ret + discount * bootstrap), rel=1e-5, abs=1e-6)


def filled_sequences(capacity: int, steps: int, period: int, span: int, seed: int = 0):
    """Two fake Atari streams (frame stacks restarted at dones) in a memory of sequences; per
    stream its steps (obs, action, reward, done) and the state given with each."""
    rng = np.random.default_rng(seed)
    sims = [FakeStream(rng, 10**6 * (j + 1)) for j in range(2)]
    memory = SequenceReplay(capacity, 2, (STACK, SIDE, SIDE), np.dtype(np.int32), True, UNITS,
                            period, span)
    memory.begin(np.arange(2), np.stack([s.obs for s in sims]))
    history: list[list[tuple]] = [[], []]
    for t in range(steps):
        out = [s.step() for s in sims]
        states = rng.normal(size=(2, 2, UNITS)).astype(np.float32)
        for j, (a, r, d, before, _) in enumerate(out):
            history[j].append((before, a, r, d, states[j]))
        memory.add(np.arange(2), np.array([o[0] for o in out]),
                   np.array([o[1] for o in out], np.float32), np.array([o[2] for o in out]),
                   np.full(2, t), np.stack([o[4] for o in out]), states)
    return memory, history


@pytest.mark.parametrize("capacity,steps", [(4000, 300), (300, 400)])
def test_a_sequence_is_consecutive_steps_from_a_period_start_with_its_state(capacity, steps):
    period, span = 5, 12
    memory, history = filled_sequences(capacity, steps, period, span)
    s, k = memory.candidates()
    assert len(s) and np.all(k % period == 0)
    # Up to the last start with all its steps known, one every period.
    for stream in (0, 1):
        held = k[s == stream]
        assert held.max() == (steps - span) // period * period
        assert np.all(np.diff(held) == period)
    out = memory.sample(64, 3, np.random.default_rng(1))
    for b in range(64):
        stream = out.index[b] // memory.rings
        # Find the sequence's first step by its first observation (frames are unique).
        first = next(t for t, step in enumerate(history[stream])
                     if np.array_equal(step[0], out.obs[b, 0]))
        assert first % period == 0
        steps_ = history[stream][first:first + span]
        assert np.array_equal(out.obs[b], np.stack([x[0] for x in steps_]))
        assert list(out.actions[b]) == [x[1] for x in steps_]
        np.testing.assert_allclose(out.rewards[b], [x[2] for x in steps_])
        assert list(out.dones[b]) == [float(x[3]) for x in steps_]
        assert list(out.starts[b]) == [0.0] + [float(x[3]) for x in steps_[:-1]]
        np.testing.assert_array_equal(out.state[b], steps_[0][4])


def test_prioritized_sequences_are_drawn_in_proportion_to_their_priorities():
    period, span = 5, 12
    memory, _ = filled_sequences(4000, 300, period, span)
    prioritized = PrioritizedSequences(4000, 2, (STACK, SIDE, SIDE), np.dtype(np.int32), True,
                                       UNITS, period, span, alpha=0.5, beta=0.4)
    for name in SequenceReplay.STATE:
        setattr(prioritized, name, getattr(memory, name))
    s, k = prioritized.candidates()
    index = s * prioritized.rings + (k // period) % prioritized.rings
    rng = np.random.default_rng(4)
    priorities = rng.random(len(index)) * 4
    prioritized.update(index, priorities)
    draws = np.concatenate([prioritized.sample(64, 3, rng).index for _ in range(3000)])
    counts = np.array([np.count_nonzero(draws == i) for i in index])
    expected = len(draws) * (priorities + PRIORITY_EPS) ** 0.5 / ((priorities + PRIORITY_EPS) ** 0.5).sum()
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected + 1))
    out = prioritized.sample(64, 3, rng)
    p = ((priorities + PRIORITY_EPS) ** 0.5 / ((priorities + PRIORITY_EPS) ** 0.5).sum())
    by_index = dict(zip(index.tolist(), p))
    weights = (len(index) * np.array([by_index[i] for i in out.index])) ** -0.4
    np.testing.assert_allclose(out.weights, weights / weights.max(), rtol=1e-5)
    assert prioritized.max_priority == pytest.approx(priorities.max() + PRIORITY_EPS)


def test_a_new_sequence_start_enters_at_the_largest_priority():
    period, span = 5, 12
    memory = PrioritizedSequences(4000, 1, (4,), np.dtype(np.float32), False, UNITS, period, span,
                                  alpha=0.5, beta=0.4)
    memory.begin(np.array([0]), np.zeros((1, 4), np.float32))

    def step(t: int) -> None:
        memory.add(np.array([0]), np.array([0]), np.array([1.0], np.float32), np.array([False]),
                   np.array([t]), np.full((1, 4), t, np.float32), np.zeros((1, 2, UNITS)))

    for t in range(20):
        step(t)
    memory.update(np.array([0]), np.array([9.0]))
    for t in range(20, 26):
        step(t)
    # Starts at steps 0 (given 9), 5, 10, 15 (the initial 1) and 20, 25 (after the 9).
    top = 9 + PRIORITY_EPS
    np.testing.assert_allclose(memory.leaves[0, :6], np.sqrt([top, 1, 1, 1, top, top]))


def test_a_restored_memory_samples_no_sequence_across_the_restart(tmp_path):
    period, span = 5, 12
    memory, _ = filled_sequences(4000, 103, period, span)
    checkpoint.write_arrays(tmp_path / "replay.npz", memory.state())
    restored = SequenceReplay(4000, 2, (STACK, SIDE, SIDE), np.dtype(np.int32), True, UNITS,
                              period, span)
    restored.restore(checkpoint.read_arrays(tmp_path / "replay.npz"), 3)
    wall = restored.steps.copy()
    rng = np.random.default_rng(5)
    restored.begin(np.arange(2), np.full((2, STACK, SIDE, SIDE), -1, np.int32))
    for t in range(40):
        restored.add(np.arange(2), np.zeros(2, np.int64), np.ones(2, np.float32),
                     np.zeros(2, bool), np.full(2, t), np.full((2, STACK, SIDE, SIDE), -t - 2),
                     rng.normal(size=(2, 2, UNITS)).astype(np.float32))
    s, k = restored.candidates()
    assert np.any(k < wall[s]) and np.any(k >= wall[s])
    assert np.all((k + span <= wall[s]) | (k >= wall[s]))
