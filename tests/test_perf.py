"""The performance tooling works and the fast paths keep learning intact: functional checks
only, since timings on a shared 2-core machine are noise (the figures are in docs/performance.md)."""
from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest
from conftest import JOBS, NO_EVAL, ddrl, env_for_tests, table

NUMBER = r"[\d,]+(?:\.\d+)?"


def test_bench_node_prints_all_figures():
    res = ddrl("bench", "node", JOBS / "cartpole.toml", "--seconds", "3", "--ranks", "2",
               timeout=240)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # One rank's ceilings on one rank's share of the cores, every thread of it (the
    # simulators' too), not on all of them.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert re.search(rf"^one rank's ceilings on {share} of {len(os.sched_getaffinity(0))} "
                     r"cores \(\[[\d, ]+\]\), times 2 rank\(s\)$", out, re.M), out
    for row in ("emulator alone", "network alone", "node"):
        assert re.search(rf"^{row}\s.*{NUMBER}", out, re.M), out
    assert re.search(rf"^node\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out, re.M), out
    for ratio in ("node / emulator alone", "node / network alone", "node / both in series"):
        assert re.search(rf"{ratio}: \d+\.\d\d", out), out
    for share in ("simulate", "predict", "train", "sync", "wait"):
        assert re.search(rf"{share} \d+%", out), out
    peak = re.search(r"peak resident memory per rank: (\d+\.\d\d) GiB", out)
    assert peak and 0.05 < float(peak.group(1)) < 8, out
    # CartPole's a2c node: one forward pass to act, 3 for its one training pass, per agent step.
    assert re.search(r"^arithmetic: \d+\.\d\d MFLOP per frame \(\d+\.\d\d MFLOP a forward pass "
                     r"x \(1 to act \+ 3 x 1 training passes\) / 1 frames an agent step\)$",
                     out, re.M), out
    assert re.search(rf"^float32 matmul \(1,024\^2\) on these threads: {NUMBER} GFLOP/s", out, re.M)
    for row in ("node", "network alone"):
        assert re.search(rf"^{row}\s+{NUMBER} GFLOP/s: \d+\.\d\d of the matmul's", out, re.M), out


def test_bench_node_rejects_bad_arguments():
    res = ddrl("bench", "node", JOBS / "cartpole.toml", "--seconds", "0", timeout=60)
    assert res.returncode == 2 and "--seconds" in res.stderr


def test_bench_dqn_calls_times_each_call_of_an_update():
    res = ddrl("bench", "dqn", JOBS / "cartpole-dqn.toml", "--calls", "8", "32", timeout=240)
    assert res.returncode == 0, res.stderr
    rows = re.findall(r"^\s+(\d+)" + rf"\s+({NUMBER})" * 6 + "$", res.stdout, re.M)
    assert [row[0] for row in rows] == ["8", "32"], res.stdout
    for size, *figures in rows:
        act, values, gradients, apply, update, per_sample = map(float, figures)
        assert min(act, values, gradients, apply) > 0, res.stdout
        assert abs(act + values + gradients + apply - update) < 0.02, res.stdout
        assert abs(update / int(size) - per_sample) < 1e-3, res.stdout


def test_bench_dqn_calls_rejects_what_it_cannot_time():
    res = ddrl("bench", "dqn", JOBS / "cartpole-r2d2.toml", "--calls", timeout=120)
    assert res.returncode != 0 and res.stderr.strip().splitlines() == [
        f"ddrl: error: {JOBS / 'cartpole-r2d2.toml'}: --calls times feed-forward DQN updates; "
        "this job is recurrent"], res.stderr
    res = ddrl("bench", "dqn", JOBS / "cartpole-dqn.toml", "--calls", "0", timeout=120)
    assert res.returncode != 0 and "ddrl: error: --calls 0: minibatch sizes are >= 1" in res.stderr


def test_bfloat16_cartpole_learns(run_dir):
    """mixed_bfloat16 (bf16 matmuls, float32 weights and heads) still solves CartPole; a2c
    keeps the run reproducible, so the frame budget is a fixed outcome, not luck."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "acting.mode=a2c",
               "--set", "model.precision=bfloat16", "--set", "run.max_frames=150000", timeout=240)
    assert res.returncode == 0, res.stderr
    evals = table(run_dir, "eval")
    assert evals["mean_return"].max() >= 400, f"best eval {evals['mean_return'].max()}"


def test_a2c_alternating_groups_reproducible(tmp_path):
    """Two groups of simulators alternate with the network; a fixed seed still gives the same
    losses update for update."""
    losses = []
    for name in ("a", "b"):
        out = tmp_path / name
        res = ddrl("train", JOBS / "cartpole.toml", "--out", out, "--set", "acting.mode=a2c",
                   "--set", "acting.n_sim=6", "--set", "run.max_frames=3000",
                   "--set", "run.log_every=1", *NO_EVAL, timeout=180)
        assert res.returncode == 0, res.stderr
        losses.append(table(out, "train")["loss"])
    k = 40
    assert len(losses[0]) >= k and len(losses[1]) >= k
    np.testing.assert_array_equal(losses[0][:k], losses[1][:k])
    # The groups really alternate: one forward pass per group per step, its first actions
    # taken before the update (policy lag 1 / t_max).
    lag = table(tmp_path / "a", "train")["policy_lag"][1:k]
    np.testing.assert_allclose(lag, 1 / 5, rtol=1e-5)


@pytest.mark.newest_stack
def test_info_model_parameter_counts_and_devices():
    # Under oneDNN's ISA limit (how an AVX2-only CPU is stood for) the CPU line says so, as
    # every benchmark's header, which prints the same line.
    res = ddrl("info", "--model", "ddrl", "nature", "a3c", timeout=120,
               env={**env_for_tests(), "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert res.returncode == 0, res.stderr
    # The family and model tell the generation of a CPU that a virtual machine names vaguely.
    limited = (r"^cpu\s+.* \(family \d+, model \d+\), \d+ cores, .*, "
               r"oneDNN limited to avx2 \(ONEDNN_MAX_CPU_ISA\)$")
    assert re.search(limited, res.stdout, re.M), res.stdout
    assert re.search(r"^devices\s+CPU:0\b.*; built with CUDA: (yes|no)$", res.stdout, re.M), res.stdout
    # Counted by hand: convolutions, FC, policy (6 actions) and value heads.
    expected = {"ddrl": (528_711, 130.05), "nature": (1_687_719, 18.69), "a3c": (677_943, 5.93)}
    for arch, (params, mflop) in expected.items():
        m = re.search(rf"model {arch}\s+params\s+([\d,]+)\s+forward\s+([\d.]+) MFLOP/obs", res.stdout)
        assert m, res.stdout
        assert int(m.group(1).replace(",", "")) == params
        assert float(m.group(2)) == pytest.approx(mflop, abs=0.01)


@pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                    reason="stable-baselines3 is an optional extra")
def test_compare_sb3_prints_both_rates():
    res = ddrl("bench", "compare-sb3", "--seconds", "2", "--modes", "a2c", timeout=300)
    assert res.returncode == 0, res.stderr
    assert re.search(rf"^\s+1\s+{NUMBER}\s+{NUMBER}\s+\d+\.\d\d$", res.stdout, re.M), res.stdout
