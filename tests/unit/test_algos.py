"""The learning math against plain numpy references written from the definitions."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from ddrl.algos.actor_critic import actor_critic_loss, clip_by_average_norm, nstep_returns
from ddrl.algos.base import log_prob
from ddrl.algos.batch import Rollout
from ddrl.algos.ppo import PPO, gae, ppo_loss
from ddrl.algos.vtrace import APPO, VTrace, vtrace
from ddrl.config import Config

RNG = np.random.default_rng(7)


def reference_nstep(rewards, dones, bootstrap, gamma):
    """R_t = sum_k gamma^k r_{t+k} up to the first done, plus gamma^n V(s_T) if none came."""
    T, N = rewards.shape
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            ret, disc = 0.0, 1.0
            for k in range(t, T):
                ret += disc * rewards[k, n]
                disc *= gamma
                if dones[k, n]:
                    break
            else:
                ret += disc * bootstrap[n]
            out[t, n] = ret
    return out


def reference_trace_sum(delta, dones, decay):
    """out_t = sum_{k>=t} (prod_{i=t}^{k-1} decay_i) delta_k, the sum ending at the episode's
    last step: GAE with decay gamma lam, V-trace with decay gamma c_i."""
    T, N = delta.shape
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            acc, weight = 0.0, 1.0
            for k in range(t, T):
                acc += weight * delta[k, n]
                if dones[k, n]:
                    break
                weight *= decay[k, n]
            out[t, n] = acc
    return out


def reference_gae(rewards, dones, values, bootstrap, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k} within the episode, from the TD errors."""
    nxt = np.vstack([values[1:], bootstrap[None]])
    delta = rewards + gamma * nxt * (1 - dones) - values
    return reference_trace_sum(delta, dones, np.full(delta.shape, gamma * lam))


def rollout(T=9, N=5):
    rewards = RNG.choice([-1.0, 0.0, 0.0, 1.0], size=(T, N)).astype(np.float32)
    dones = (RNG.random((T, N)) < 0.2).astype(np.float32)
    values = RNG.standard_normal((T, N)).astype(np.float32)
    bootstrap = RNG.standard_normal(N).astype(np.float32)
    return rewards, dones, values, bootstrap


def test_nstep_returns_match_the_definition():
    rewards, dones, _, bootstrap = rollout()
    got = nstep_returns(rewards, dones, bootstrap, 0.99)
    np.testing.assert_allclose(got, reference_nstep(rewards, dones, bootstrap, 0.99), rtol=1e-5)


def test_a_done_step_ignores_the_bootstrap():
    got = nstep_returns(np.array([[1.0], [0.0]]), np.array([[0.0], [1.0]]), np.array([100.0]), 0.5)
    np.testing.assert_allclose(got[:, 0], [1.0, 0.0])


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_the_definition(lam):
    rewards, dones, values, bootstrap = rollout()
    adv, returns = gae(rewards, dones, values, bootstrap, 0.99, lam)
    np.testing.assert_allclose(adv, reference_gae(rewards, dones, values, bootstrap, 0.99, lam),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(returns, adv + values, rtol=1e-6)


def test_gae_with_lambda_one_is_the_nstep_advantage():
    rewards, dones, values, bootstrap = rollout()
    adv, _ = gae(rewards, dones, values, bootstrap, 0.99, 1.0)
    np.testing.assert_allclose(adv + values, nstep_returns(rewards, dones, bootstrap, 0.99),
                               rtol=1e-4, atol=1e-5)


def test_log_prob_matches_softmax():
    logits = RNG.standard_normal((6, 4))
    actions = RNG.integers(0, 4, 6)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(log_prob(logits, actions), np.log(p[np.arange(6), actions]),
                               rtol=1e-6)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_actor_critic_loss_signs_and_scale():
    logits = RNG.standard_normal((8, 3)).astype(np.float32)
    values = RNG.standard_normal(8).astype(np.float32)
    actions = RNG.integers(0, 3, 8).astype(np.int32)
    returns = RNG.standard_normal(8).astype(np.float32)
    loss, stats = actor_critic_loss(tf.constant(logits), tf.constant(values), tf.constant(actions),
                                    tf.constant(returns), 0.01, 0.5)
    p = softmax(logits)
    adv = returns - values
    policy = -np.mean(np.log(p[np.arange(8), actions]) * adv)
    entropy = -np.mean((p * np.log(p)).sum(-1))
    value = np.mean(adv ** 2)
    np.testing.assert_allclose(float(stats["policy_loss"]), policy, rtol=1e-5)
    np.testing.assert_allclose(float(stats["entropy"]), entropy, rtol=1e-5)
    np.testing.assert_allclose(float(loss), policy + 0.5 * value - 0.01 * entropy, rtol=1e-5)


def test_ppo_loss_clips_the_ratio_and_the_value():
    n, clip = 16, 0.1
    logits = RNG.standard_normal((n, 4)).astype(np.float32)
    values = RNG.standard_normal(n).astype(np.float32)
    actions = RNG.integers(0, 4, n).astype(np.int32)
    p = softmax(logits)
    logp_new = np.log(p[np.arange(n), actions])
    # Behaviour log-probabilities far enough off that some ratios fall outside 1 +- clip.
    old = (logp_new + RNG.normal(0, 0.3, n)).astype(np.float32)
    targets = {"advantages": RNG.standard_normal(n).astype(np.float32),
               "returns": RNG.standard_normal(n).astype(np.float32), "logp": old,
               "values": (values + RNG.normal(0, 0.3, n)).astype(np.float32)}
    loss, stats = ppo_loss(tf.constant(logits), tf.constant(values), tf.constant(actions),
                           {k: tf.constant(v) for k, v in targets.items()}, clip,
                           clip_value=True, normalize=True, entropy_coef=0.01, value_coef=0.25)
    adv = targets["advantages"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(logp_new - old)
    policy = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv))
    v_old, ret = targets["values"], targets["returns"]
    v_clip = v_old + np.clip(values - v_old, -clip, clip)
    value = np.mean(np.maximum((values - ret) ** 2, (v_clip - ret) ** 2))
    entropy = -np.mean((p * np.log(p)).sum(-1))
    assert 0 < float(stats["clip_frac"]) < 1
    np.testing.assert_allclose(float(stats["clip_frac"]), np.mean(np.abs(ratio - 1) > clip))
    np.testing.assert_allclose(float(stats["policy_loss"]), policy, rtol=1e-4)
    np.testing.assert_allclose(float(stats["value_loss"]), value, rtol=1e-4)
    np.testing.assert_allclose(float(loss), policy + 0.25 * value - 0.01 * entropy, rtol=1e-4)
    np.testing.assert_allclose(float(stats["approx_kl"]), np.mean(ratio - 1 - np.log(ratio)),
                               rtol=1e-4)


def test_clip_by_average_norm_bounds_the_average_norm():
    g = tf.constant(RNG.standard_normal(100).astype(np.float32) * 10)
    clipped = clip_by_average_norm(g, 0.1).numpy()
    np.testing.assert_allclose(np.linalg.norm(clipped) / 100, 0.1, rtol=1e-5)
    small = tf.constant(np.full(100, 1e-4, np.float32))
    np.testing.assert_allclose(clip_by_average_norm(small, 0.1).numpy(), small.numpy())


def reference_vtrace(rewards, dones, values, bootstrap, mu, pi, gamma, rho_bar, c_bar):
    """IMPALA's eq. (1) summed term by term: v_s = V(x_s) + sum_{t>=s} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) delta_t, the sum ending at the episode's last step."""
    ratio = np.exp(pi - mu)
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    nxt = np.vstack([values[1:], bootstrap[None]])
    delta = rho * (rewards + gamma * nxt * (1 - dones) - values)
    vs = values + reference_trace_sum(delta, dones, gamma * c)
    next_vs = np.vstack([vs[1:], bootstrap[None]])
    return vs, rewards + gamma * next_vs * (1 - dones), rho


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.5), (100.0, 100.0)])
def test_vtrace_matches_the_definition(rho_bar, c_bar):
    rewards, dones, values, bootstrap = rollout()
    mu = np.log(RNG.uniform(0.05, 1, rewards.shape))
    pi = np.log(RNG.uniform(0.05, 1, rewards.shape))
    got = vtrace(rewards, dones, values, bootstrap, mu, pi, 0.99, rho_bar, c_bar)
    want = reference_vtrace(rewards, dones, values, bootstrap, mu, pi, 0.99, rho_bar, c_bar)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    if rho_bar < 100:  # truncation takes effect: some weights hit the clip, some stay below
        assert (got[2] == np.float32(rho_bar)).any() and (got[2] < rho_bar).any()


def test_vtrace_on_policy_is_the_nstep_return():
    rewards, dones, values, bootstrap = rollout()
    logp = np.log(RNG.uniform(0.05, 1, rewards.shape))
    vs, q, rho = vtrace(rewards, dones, values, bootstrap, logp, logp, 0.99, 1.0, 1.0)
    np.testing.assert_allclose(vs, nstep_returns(rewards, dones, bootstrap, 0.99), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(rho, 1.0)


def test_vtrace_ends_the_trace_at_a_done_and_ignores_the_bootstrap_there():
    rewards = np.array([[1.0], [2.0]], np.float32)
    values = np.array([[0.5], [0.25]], np.float32)
    dones = np.array([[1.0], [0.0]], np.float32)
    zeros = np.zeros((2, 1))
    vs, q, _ = vtrace(rewards, dones, values, np.array([4.0], np.float32), zeros, zeros, 0.5,
                      1.0, 1.0)
    np.testing.assert_allclose(vs[:, 0], [1.0, 2.0 + 0.5 * 4.0])
    np.testing.assert_allclose(q[:, 0], [1.0, 4.0])


def test_vtrace_and_appo_targets():
    cfg = Config()
    rewards, dones, values, bootstrap = rollout()
    mu = np.log(RNG.uniform(0.05, 1, rewards.shape)).astype(np.float32)
    pi = np.log(RNG.uniform(0.05, 1, rewards.shape)).astype(np.float32)
    r = Rollout(rewards, dones, values, mu, bootstrap, pi)
    vs, q, rho = vtrace(rewards, dones, values, bootstrap, mu, pi, cfg.algo.gamma, 1.0, 1.0)
    v = VTrace(cfg).targets(r)
    np.testing.assert_allclose(v["returns"], vs)
    np.testing.assert_allclose(v["advantages"], rho * (q - values), rtol=1e-6)
    np.testing.assert_array_equal(v["logp"], mu)
    a = APPO(cfg).targets(r)
    np.testing.assert_allclose(a["advantages"], q - values, rtol=1e-6)
    np.testing.assert_array_equal(a["logp"], mu)


def test_actor_critic_loss_takes_given_advantages_for_the_policy_only():
    logits = RNG.standard_normal((8, 3)).astype(np.float32)
    values = RNG.standard_normal(8).astype(np.float32)
    actions = RNG.integers(0, 3, 8).astype(np.int32)
    returns = RNG.standard_normal(8).astype(np.float32)
    adv = RNG.standard_normal(8).astype(np.float32)
    _, stats = actor_critic_loss(tf.constant(logits), tf.constant(values), tf.constant(actions),
                                 tf.constant(returns), 0.01, 0.5, advantages=tf.constant(adv))
    p = softmax(logits)
    np.testing.assert_allclose(float(stats["policy_loss"]),
                               -np.mean(np.log(p[np.arange(8), actions]) * adv), rtol=1e-5)
    np.testing.assert_allclose(float(stats["value_loss"]), np.mean((returns - values) ** 2),
                               rtol=1e-5)


def test_vtrace_loss_reports_how_far_the_policy_moved_from_the_acting_one():
    n = 32
    logits = RNG.standard_normal((n, 3)).astype(np.float32)
    actions = RNG.integers(0, 3, n).astype(np.int32)
    current = np.log(softmax(logits)[np.arange(n), actions])
    mu = (current + RNG.normal(0, 0.5, n)).astype(np.float32)
    targets = {"returns": RNG.standard_normal(n).astype(np.float32),
               "advantages": RNG.standard_normal(n).astype(np.float32), "logp": mu}
    _, stats = VTrace(Config()).loss(tf.constant(logits), tf.constant(np.zeros(n, np.float32)),
                                     tf.constant(actions),
                                     {k: tf.constant(v) for k, v in targets.items()})
    ratio = np.exp(current - mu)
    assert np.isnan(float(stats["clip_frac"]))
    np.testing.assert_allclose(float(stats["approx_kl"]), np.mean(ratio - 1 - np.log(ratio)),
                               rtol=1e-4)


def test_rollout_normalisation_standardises_once_and_the_loss_keeps_it():
    cfg = Config()
    cfg.algo.normalize_over = "rollout"
    rewards, dones, values, bootstrap = rollout(T=32, N=16)
    r = Rollout(rewards, dones, values, RNG.standard_normal(rewards.shape).astype(np.float32),
                bootstrap)
    adv = PPO(cfg).targets(r)["advantages"]
    raw, _ = gae(rewards, dones, values, bootstrap, cfg.algo.gamma, cfg.algo.gae_lambda)
    np.testing.assert_allclose(adv, (raw - raw.mean()) / (raw.std() + 1e-8), rtol=1e-5)
    # A minibatch of 4 keeps the rollout's scale: the loss does not standardise it again.
    n = 4
    logits = np.zeros((n, 3), np.float32)
    part = {"advantages": adv[0, :n], "returns": np.zeros(n, np.float32),
            "logp": np.full(n, np.log(1 / 3), np.float32), "values": np.zeros(n, np.float32)}
    _, stats = PPO(cfg).loss(tf.constant(logits), tf.constant(np.zeros(n, np.float32)),
                             tf.constant(np.zeros(n, np.int32)),
                             {k: tf.constant(v) for k, v in part.items()})
    np.testing.assert_allclose(float(stats["policy_loss"]), -adv[0, :n].mean(), rtol=1e-5)
    assert APPO(cfg).targets(Rollout(rewards, dones, values, r.logp, bootstrap,
                                     r.logp))["advantages"].std() == pytest.approx(1, abs=1e-4)
