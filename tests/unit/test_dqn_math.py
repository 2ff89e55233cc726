"""DQN's replay memory and targets against plain references."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from replay_streams import SIDE, STACK, FakeStream

from ddrl.acting.replay import ReplayMemory
from ddrl.algos.dqn import DQN, bootstrap_values, epsilon, huber
from ddrl.config import Config, load_config
from ddrl.learner import Learner
from ddrl.rundir import checkpoint

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def filled_memory(capacity: int, streams: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sims = [FakeStream(rng, 10**6 * (j + 1)) for j in range(streams)]
    memory = ReplayMemory(capacity, streams, (STACK, SIDE, SIDE), np.dtype(np.int32), stacked=True)
    memory.begin(np.arange(streams), np.stack([s.obs for s in sims]))
    # Per stream, the transitions in order: (obs, action, reward, done, next_obs).
    history: list[list[tuple]] = [[] for _ in range(streams)]
    for t in range(steps):
        out = [s.step() for s in sims]
        for j, (a, r, d, before, after) in enumerate(out):
            history[j].append((before, a, r, d, after))
        memory.add(np.arange(streams), np.array([o[0] for o in out]),
                   np.array([o[1] for o in out], np.float32), np.array([o[2] for o in out]),
                   np.full(streams, t), np.stack([o[4] for o in out]))
    return memory, history


def nstep_targets(rewards: np.ndarray, dones: np.ndarray, bootstrap: np.ndarray) -> np.ndarray:
    """DQN's targets where the target network values every state n steps on at `bootstrap`."""
    q = bootstrap[:, None]
    return DQN(Config()).replay_targets(rewards, dones, (q, bootstrap), q)["returns"]


def reference(history: list[tuple], index: int, n: int, gamma: float, bootstrap: float):
    """The n-step target of transition `index`, written out step by step."""
    ret, discount = 0.0, 1.0
    for k in range(n):
        _, _, r, d, _ = history[index + k]
        ret += discount * r
        discount *= gamma
        if d:
            return ret
    return ret + discount * bootstrap


@pytest.mark.parametrize("capacity,steps", [(4000, 300), (400, 500)])
def test_replay_rebuilds_each_observation_and_its_n_step_successor(capacity, steps):
    n = 3
    memory, history = filled_memory(capacity, 2, steps)
    t = memory.sample(256, n, np.random.default_rng(1))
    obs, actions, next_obs, acted_at = t.obs, t.actions, t.next_obs, t.acted_at
    boot = np.arange(256, dtype=np.float32)
    targets = nstep_targets(t.rewards, t.dones, boot)
    for i in range(256):
        stream = int(obs[i, -1, 0, 0]) // 10**6 - 1
        index = next(k for k, h in enumerate(history[stream])
                     if h[0][-1, 0, 0] == obs[i, -1, 0, 0])
        before, action, _, _, _ = history[stream][index]
        assert np.array_equal(obs[i], before)
        assert actions[i] == action and acted_at[i] == index
        cut = next((k for k in range(n) if history[stream][index + k][3]), None)
        if cut is None:
            # The observation n steps on is the one the simulator returned then.
            assert np.array_equal(next_obs[i], history[stream][index + n - 1][4])
        assert targets[i] == pytest.approx(
            reference(history[stream], index, n, Config().algo.gamma, boot[i]), rel=1e-5)
    # Only what fits is kept: the oldest transitions of a full memory are gone.
    if capacity < steps * 2:
        assert acted_at.min() >= steps - capacity // 2


def test_replay_stores_each_frame_once():
    memory, history = filled_memory(10_000, 1, 1000)
    dones = sum(h[3] for h in history[0])
    # One frame per step, plus the three older frames of every restarted stack.
    assert memory.head[0] == STACK + 1000 + 3 * dones
    assert memory.transitions == 1000


def test_double_dqn_takes_the_target_networks_value_of_the_online_argmax():
    q_target = np.array([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]])
    q_online = np.array([[9.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    assert np.array_equal(bootstrap_values(q_target, q_online, double=True), [1.0, -1.0])
    assert np.array_equal(bootstrap_values(q_target, q_online, double=False), [5.0, 3.0])


def test_epsilon_anneals_linearly_then_stays():
    cfg = Config()
    cfg.dqn.eps_start, cfg.dqn.eps_final, cfg.dqn.eps_steps = 1.0, 0.1, 1000
    assert [epsilon(cfg, s) for s in (0, 500, 1000, 5000)] == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_huber_is_quadratic_inside_one_and_has_gradients_clipped_to_one():
    x = tf.constant([-3.0, -0.5, 0.0, 0.5, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = huber(x)
    assert np.allclose(y.numpy(), [2.5, 0.125, 0.0, 0.125, 2.5])
    assert np.allclose(tape.gradient(y, x).numpy(), [-1.0, -0.5, 0.0, 0.5, 1.0])


def test_a_restored_memory_samples_no_chain_across_the_restart(tmp_path):
    """Saved, read back and restored (`dqn.save_replay`); the simulators then start new
    games with no done in between, so no sampled n-step chain may run from an old game
    into a new one."""
    n, steps, more = 3, 300, 50
    memory, old = filled_memory(4000, 2, steps)
    checkpoint.write_arrays(tmp_path / "replay.npz", memory.state())
    restored = ReplayMemory(4000, 2, (STACK, SIDE, SIDE), np.dtype(np.int32), stacked=True)
    restored.restore(checkpoint.read_arrays(tmp_path / "replay.npz"), n)
    assert restored.transitions == 2 * (steps - (n - 1))
    with pytest.raises(ValueError, match="frames"):
        ReplayMemory(4000, 2, (STACK, 2, 2), np.dtype(np.int32), stacked=True).restore(
            memory.state(), n)

    rng = np.random.default_rng(5)
    sims = [FakeStream(rng, 10**6 * (j + 3)) for j in range(2)]
    restored.begin(np.arange(2), np.stack([s.obs for s in sims]))
    new: list[list[tuple]] = [[], []]
    for t in range(more):
        out = [s.step() for s in sims]
        for j, step in enumerate(out):
            new[j].append((step[3], *step[:3], step[4]))
        restored.add(np.arange(2), np.array([o[0] for o in out]),
                     np.array([o[1] for o in out], np.float32), np.array([o[2] for o in out]),
                     np.full(2, steps + t), np.stack([o[4] for o in out]))
    assert restored.transitions == 2 * (steps - (n - 1) + more)

    t = restored.sample(2000, n, np.random.default_rng(1))
    obs, next_obs = t.obs, t.next_obs
    targets = nstep_targets(t.rewards, t.dones, np.zeros(2000, np.float32))
    histories = {1: old[0], 2: old[1], 3: new[0], 4: new[1]}
    for i in range(2000):
        history = histories[int(obs[i, -1, 0, 0]) // 10**6]
        index = next(k for k, h in enumerate(history) if h[0][-1, 0, 0] == obs[i, -1, 0, 0])
        # Its n steps are known, or a done in them cuts the chain.
        assert index + n <= len(history) or any(h[3] for h in history[index:])
        assert np.array_equal(obs[i], history[index][0])
        if not any(history[index + k][3] for k in range(n)):
            assert np.array_equal(next_obs[i], history[index + n - 1][4])
        assert targets[i] == pytest.approx(
            reference(history, index, n, Config().algo.gamma, 0.0), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("job,sets", [
    ("cartpole-dqn.toml", []), ("cartpole-dqn.toml", ["dqn.atoms=11", "dqn.dueling=true"]),
    ("cartpole-r2d2.toml", [])])
def test_both_networks_in_one_call_are_each_network_alone(job, sets):
    """Double DQN's fused call: the target's outputs and the online Q, also after the target
    takes new weights (it reads the variables, not a copy made when it was traced)."""
    cfg = load_config(JOBS / job, sets)
    learner = Learner(cfg, (4,), np.dtype(np.float32), 2)
    target = learner.frozen_copy()
    both = learner.beside(target)
    rng = np.random.default_rng(0)
    if cfg.dqn.recurrent:
        units = cfg.dqn.recurrent
        inputs = (rng.normal(size=(3, 5, 4)).astype(np.float32), np.zeros((3, 5), np.float32),
                  *rng.normal(size=(2, 3, units)).astype(np.float32))
    else:
        inputs = (rng.normal(size=(7, 4)).astype(np.float32),)
    weights = learner.get_weights()
    for step in range(2):
        # The online network moves away from the target, then the target follows.
        learner.set_weights(weights + rng.normal(scale=0.1, size=weights.shape).astype(np.float32))
        if step:
            target.load(learner.get_weights() * 0.5)
        target_out, online = both(*inputs)
        for mine, alone in zip(target_out, target.predict(*inputs)):
            np.testing.assert_allclose(mine, alone, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(online, learner.predict(*inputs)[0], rtol=1e-5, atol=1e-6)
        assert np.abs(online - target_out[0]).max() > 1e-3


def test_sampling_a_memory_with_nothing_to_draw_ends_instead_of_looping_for_ever():
    """3 steps per stream hold no transition with 10 successors: the draws never succeed."""
    memory, _ = filled_memory(4000, 2, 3)
    with pytest.raises(ValueError, match="no transition with its 10 following steps"):
        memory.sample(32, 10, np.random.default_rng(0))
    assert len(memory.sample(32, 1, np.random.default_rng(0)).actions) == 32
