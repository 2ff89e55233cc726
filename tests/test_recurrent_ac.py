"""The recurrent actor-critic (algo.recurrent): real CartPole simulators, the real a2c node and
learner in-process, then `ddrl train` on two ranks."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import JOBS, NO_EVAL, ddrl, table

RECURRENT_PPO = ["algo.name=ppo", "acting.mode=a2c", "acting.n_sim=8", "acting.t_max=64",
                 "algo.recurrent=16", "optim.lr=1e-3", "optim.max_grad_norm=0.5"]


def test_the_learner_unrolls_each_rollout_from_the_state_its_simulator_acted_from():
    """Before any update, the learner's policy and values on every minibatch equal the actor's
    at sampling time (PPO's first ratios are 1), across the games that end inside a rollout;
    with the stored states zeroed they do not, so the states are what makes them equal."""
    from ddrl.acting.a2c import A2CActors
    from ddrl.algos.base import log_prob
    from ddrl.config import load_config
    from ddrl.envs import env_spec
    from ddrl.learner import Learner

    cfg = load_config(JOBS / "cartpole.toml", RECURRENT_PPO)
    learner = Learner(cfg, *env_spec(cfg))
    actors = A2CActors(cfg, learner, rank=0, restart=0)
    try:
        a = cfg.algo
        # The second rollout, whose simulators start from states carried over the first.
        batches = [actors.next_batch() for _ in range(a.epochs * a.minibatches + a.minibatches)]
        batches = batches[-a.minibatches:]
    finally:
        actors.close()
    starts = np.concatenate([b.targets["starts"] for b in batches])
    assert starts.shape == (8, 64) and 0 < starts[:, 1:].sum()  # games ended mid-rollout
    for b in batches:
        assert b.obs.shape == (2, 64, 4) and b.targets["state"].shape == (2, 2, 16)
        logits, values = learner.algo.forward(learner.model, b.obs, b.targets, training=False)
        np.testing.assert_allclose(log_prob(logits.numpy().reshape(-1, 2), b.actions.ravel()),
                                   b.targets["logp"].ravel(), atol=2e-5)
        np.testing.assert_allclose(values.numpy(), b.targets["values"], atol=2e-5)
    # A simulator whose game began at the rollout's first step acted from a zeroed state.
    states = np.concatenate([b.targets["state"] for b in batches])
    kept = np.abs(states).max(axis=(1, 2)) > 0
    assert kept.any() and (kept == (starts[:, 0] == 0)).all()
    off = 0.0
    for b in batches:
        zeroed = {**b.targets, "state": np.zeros_like(b.targets["state"])}
        _, wrong = learner.algo.forward(learner.model, b.obs, zeroed, training=False)
        off = max(off, np.abs(wrong.numpy() - b.targets["values"]).max())
    assert off > 1e-4

def test_the_ba3c_node_unrolls_each_segment_from_the_state_it_was_acted_from():
    """The ba3c node (central mode's learner): its predictor carries each simulator's state
    and cuts fixed segments of acting.t_max steps across game ends. Before any update, unrolled
    from its stored state, each segment gives the actor's log-probs; V-trace's targets, which
    unroll the learner's net for the values and the bootstrap, equal A2C's n-step returns on
    the actor's values (rho = c = 1 when the policies are the same)."""
    from ddrl.acting.ba3c import BA3CActors
    from ddrl.acting.experience import sequences_batch
    from ddrl.algos.actor_critic import A2C
    from ddrl.algos.base import log_prob
    from ddrl.algos.recurrent import OverSequences
    from ddrl.config import load_config
    from ddrl.envs import env_spec
    from ddrl.learner import Learner

    cfg = load_config(JOBS / "cartpole.toml", [
        "algo.name=vtrace", "acting.mode=ba3c", "algo.recurrent=16", "acting.t_max=16",
        "acting.batch_size=64", "acting.n_sim=8", "acting.predictors=2"])
    learner = Learner(cfg, *env_spec(cfg))
    actors = BA3CActors(cfg, learner, rank=0, restart=0)
    actors.start(lambda: False)
    try:
        segments = [s for _ in range(8) for s in actors.fifo.take(64)]
    finally:
        actors.close()
    assert [len(s) for s in segments] == [16] * 32
    off = sequences_batch(segments, learner.algo, learner.predict)
    on = sequences_batch(segments, OverSequences(cfg, A2C(cfg)), learner.predict)
    starts, states = off.targets["starts"], off.targets["state"]
    assert starts.shape == (32, 16) and starts[:, 1:].sum() > 0  # games ended mid-segment
    np.testing.assert_allclose(off.targets["returns"], on.targets["returns"], atol=1e-4)
    logits, _ = learner.algo.forward(learner.model, off.obs, off.targets, training=False)
    np.testing.assert_allclose(log_prob(logits.numpy().reshape(-1, 2), off.actions.ravel()),
                               off.targets["logp"].ravel(), atol=2e-5)
    kept = np.abs(states).max(axis=(1, 2)) > 0
    assert kept.any() and (kept == (starts[:, 0] == 0)).all()
    zeroed = {**off.targets, "state": np.zeros_like(states)}
    wrong, _ = learner.algo.forward(learner.model, off.obs, zeroed, training=False)
    assert np.abs(wrong.numpy() - logits.numpy()).max() > 1e-4


DIGEST = re.compile(r"\[ddrl\] rank (\d+) final weights sha256 ([0-9a-f]+)")


def test_recurrent_ppo_learns_cartpole_on_two_ranks_as_one_agent(run_dir):
    """Judged on the sampled policy's training games, not on greedy evaluations: a greedy
    CartPole policy can balance the pole for hundreds of steps after a few dozen updates. With
    64 units the games' mean went from about 30 (random play: 22) over the first 5,000 frames to
    107-146 over 10,000-15,000 on seeds 0-2 (docs/results/recurrent.md)."""
    sets = [x for s in RECURRENT_PPO + ["algo.recurrent=64", "acting.n_sim=4",
                                        "run.max_frames=16000"] for x in ("--set", s)]
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *sets, *NO_EVAL, ranks=2,
               timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    digests = dict(DIGEST.findall(res.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, res.stdout
    games = table(run_dir, "episodes")
    late = games[games["frames"] > 8000]["return"]
    assert len(late) >= 10 and late.mean() >= 80, games
    assert (table(run_dir, "train")["effective_batch"] == 2).all()  # 4 rollouts a minibatch


@pytest.mark.parametrize("sets, message", [
    (["acting.mode=dqn", "algo.name=dqn"], "runs on the a2c or ba3c node"),
    (["algo.minibatches=16"], "16 minibatches of 8 sequences"),
    (["acting.mode=ba3c", "acting.batch_size=100"], "100 is not a whole number of acting.t_max = 64"),
])
def test_what_a_recurrent_actor_critic_cannot_do_is_one_line(sets, message, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir,
               *[x for s in RECURRENT_PPO + sets for x in ("--set", s)], timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("ddrl: error: config key"), res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_game_shown_in_part_gives_the_observation_those_state_variables(run_dir):
    from ddrl.config import load_config
    from ddrl.envs import env_spec, make_pool

    cfg = load_config(JOBS / "cartpole.toml", ["env.observe=[0, 2]"])
    assert env_spec(cfg)[0] == (2,)
    full, shown = (make_pool(load_config(JOBS / "cartpole.toml", sets), 2, seed=3, train=True)
                   for sets in ([], ["env.observe=[0, 2]"]))
    try:
        for _ in range(3):
            a, b = full.recv(), shown.recv()
            np.testing.assert_array_equal(a.obs[:, [0, 2]], b.obs)
            for pool in (full, shown):
                pool.send(np.zeros(2, np.int32))
    finally:
        full.close()
        shown.close()
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "env.observe=[0, 4]",
               timeout=60)
    assert res.returncode == 2 and res.stderr.strip() == (
        "ddrl: error: config key env.observe: [0, 4] picks from CartPole-v1's 4 state variables "
        "(indices 0-3)"), res.stderr
    assert not (run_dir / "log.h5").exists()
