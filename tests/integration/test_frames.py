"""Central mode's frame stacks over the wire (ddrl/distributed/frames.py) on real ALE
simulators: what the learner rebuilds from newest frames is every stack the simulators gave."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ddrl.config import load_config
from ddrl.distributed.frames import StackReceiver, StackSender
from ddrl.envs import make_pool

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_the_learner_rebuilds_every_stack_from_newest_frames():
    # Short games (truncated at 160 frames) and episodic life: many new stacks in 400 steps;
    # 3 of 5 simulators per step, so steps come for varying subsets.
    cfg = load_config(JOBS / "pong-ppo.toml", ["env.max_episode_frames=160", "env.decorrelate=0",
                                               "env.size=64"])
    pool = make_pool(cfg, 5, seed=3, train=True, batch_size=3)
    sender = StackSender(pool.num_envs, stacked=True)
    step = pool.recv()
    receiver = StackReceiver(pool.num_envs + 7, step.obs.shape[1:], step.obs.dtype, stacked=True)
    rng = np.random.default_rng(0)
    sent = whole_count = new_games = 0
    try:
        for _ in range(400):
            whole, data = sender.encode(step.env_ids, step.obs, step.done)
            assert len(data) == receiver.nbytes(whole)
            # Learner-wide indices: this pool's simulators after some other group's 7.
            rebuilt = receiver.decode(step.env_ids + 7, whole, data)
            np.testing.assert_array_equal(rebuilt, step.obs)
            sent += len(data)
            whole_count += int(whole.sum())
            new_games += int(step.done.sum())
            pool.send(rng.integers(0, pool.n_actions, len(step.env_ids)))
            step = pool.recv()
    finally:
        pool.close()
    assert new_games >= 5 and whole_count < 0.2 * 400 * 3
    stack_bytes = int(np.prod(step.obs.shape[1:]))
    assert sent < 0.4 * 400 * 3 * stack_bytes  # about a quarter of the stacks' bytes


def test_vector_observations_go_whole():
    sender = StackSender(3, stacked=False)
    receiver = StackReceiver(3, (4,), np.float32, stacked=False)
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    whole, data = sender.encode(np.arange(3), obs, np.zeros(3, bool))
    assert whole.all() and len(data) == receiver.nbytes(whole) == 48
    np.testing.assert_array_equal(receiver.decode(np.arange(3), whole, data), obs)
