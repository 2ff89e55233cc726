"""DQN's schedule in process, on real CartPole simulators and a numpy stand-in for the network:
when the target network takes the weights, how many agent steps each minibatch costs, and in
concurrent mode that a period's experience enters the memory only at the next target update
and was acted by the target network."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddrl.acting.dqn import DQNActors
from ddrl.algos import make_algorithm
from ddrl.config import load_config

JOBS = Path(__file__).resolve().parents[2] / "jobs"


class Network:
    """Q-values of zero; `version` stands for the weights, so a copy shows which it took."""

    def __init__(self):
        self.version = 0
        self.calls = 0

    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        return np.zeros((len(obs), 2), np.float32), np.zeros(len(obs), np.float32)


class Learner(Network):
    recurrent = 0

    def __init__(self, cfg):
        super().__init__()
        self.algo = make_algorithm(cfg)
        self.copies: list[Target] = []

    def get_weights(self) -> np.ndarray:
        return np.array([self.version], np.float32)

    def beside(self, other: "Target"):
        return lambda obs: (other.predict(obs), self.predict(obs)[0])

    def frozen_copy(self) -> "Target":
        self.copies.append(Target())
        return self.copies[-1]


class Target(Network):
    def __init__(self):
        super().__init__()
        self.loads: list[int] = []

    def load(self, flat: np.ndarray) -> None:
        self.loads.append(int(flat[0]))
        self.version = int(flat[0])


def actors(sets: list[str]) -> tuple[DQNActors, Learner]:
    cfg = load_config(JOBS / "cartpole-dqn.toml", ["dqn.prepopulate=64", "acting.batch_size=8",
                                                 "dqn.replay_frames=5000", *sets])
    learner = Learner(cfg)
    a = DQNActors(cfg, learner, rank=0, restart=0)
    a.start(lambda: False)
    return a, learner


def train(a: DQNActors, learner: Learner, updates: int) -> None:
    for _ in range(updates):
        a.next_batch()
        learner.version += 1  # the update the loop would apply
        a.update += 1


@pytest.mark.parametrize("samplers, train_period", [(4, 1), (1, 4), (2, 3)])
def test_standard_mode_pays_train_period_steps_per_minibatch_and_updates_the_target_on_time(
        samplers, train_period):
    a, learner = actors([f"dqn.samplers={samplers}", f"dqn.train_period={train_period}",
                         "dqn.target_period=12", "dqn.concurrent=false"])
    try:
        frames0 = a.frames
        train(a, learner, 30)
        steps = (a.frames - frames0)  # CartPole: one frame per agent step
        # Whole rounds of every sampler, never fewer steps than the minibatches cost.
        assert steps % samplers == 0 and 30 * train_period <= steps < 30 * train_period + samplers
        target = learner.copies[0]
        assert len(target.loads) == steps // 12
        # Each load takes the weights of the update at which its period's steps were done.
        assert target.loads == sorted(target.loads) and len(set(target.loads)) == len(target.loads)
    finally:
        a.close()


def test_concurrent_mode_stores_a_period_at_the_next_target_update_acted_by_the_target():
    a, learner = actors(["dqn.samplers=2", "dqn.train_period=2", "dqn.target_period=8",
                         "dqn.concurrent=true", "dqn.synchronized=false"])
    try:
        target = learner.copies[0]
        stored = [a.memory.transitions]
        for _ in range(3):  # three periods of target_period / train_period = 4 minibatches
            for _ in range(4):
                train(a, learner, 1)
                stored.append(a.memory.transitions)
        # The memory grows only at the first minibatch of each period, by the previous
        # period's steps (none before the first period's end).
        growth = np.diff(stored)
        assert growth.tolist() == [0, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0]
        assert target.loads == [0, 4, 8]
        a._sampler.result()
        assert target.calls > 0  # the sampler acts with the target network
    finally:
        a.close()


def test_an_error_in_the_concurrent_sampler_reaches_the_trainer():
    """Not a thread that dies alone, leaving the trainer on a memory that stopped growing."""
    a, learner = actors(["dqn.samplers=2", "dqn.train_period=2", "dqn.target_period=8",
                         "dqn.concurrent=true", "dqn.synchronized=false"])

    def broken(*args):
        raise RuntimeError("the simulator went away")

    a.samplers.collect = broken
    try:
        with pytest.raises(RuntimeError, match="the simulator went away"):
            train(a, learner, 8)
    finally:
        with pytest.raises(RuntimeError):
            a.close()


def test_a_memory_restored_below_prepopulate_is_filled_up_to_it(tmp_path):
    """A run stopped during its prepopulation saved a small memory: the resume fills it."""
    sets = ["dqn.save_replay=true", "dqn.prepopulate=400"]
    a, _ = actors(sets)
    a.close()
    a.save_state(tmp_path, 0)
    cfg = load_config(JOBS / "cartpole-dqn.toml", ["acting.batch_size=8", "dqn.replay_frames=5000",
                                                 "dqn.save_replay=true", "dqn.prepopulate=1000"])
    b = DQNActors(cfg, Learner(cfg), rank=0, restart=1)
    b.restore_state(tmp_path, 0)
    assert 300 <= b.memory.transitions < 1000  # a few dropped per stream (see restore)
    b.start(lambda: False)
    try:
        assert b.memory.transitions >= 1000
    finally:
        b.close()


@pytest.mark.parametrize("update", [0, 20_000])
def test_a_resumed_run_without_its_memory_refills_it_acting_as_the_agent(update):
    """A fresh run prepopulates with random actions; a run resumed at update 20,000 without its
    saved memory refills it with its weights at the schedule's epsilon (0.02 here): the stand-in
    network's Q-values are all 0, so its greedy action is action 0."""
    cfg = load_config(JOBS / "cartpole-dqn.toml", ["dqn.prepopulate=400", "acting.batch_size=8",
                                                 "dqn.replay_frames=5000"])
    learner = Learner(cfg)
    a = DQNActors(cfg, learner, rank=0, restart=1 if update else 0)
    a.update = update
    a.start(lambda: False)
    try:
        acted = a.memory.actions[a.memory.acted]
        assert len(acted) >= 400
        share_of_action_0 = float(np.mean(acted == 0))
        if update:
            assert learner.calls > 0 and share_of_action_0 > 0.95
        else:
            assert learner.calls == 0 and 0.35 < share_of_action_0 < 0.65
    finally:
        a.close()
