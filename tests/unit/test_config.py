"""Config loading, coercion and validation, in-process."""
from __future__ import annotations

from pathlib import Path

import pytest

from ddrl.config import load_config
from ddrl.errors import DdrlError

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.parametrize("job", sorted(JOBS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_job_loads(job):
    load_config(job)


def test_overrides_are_toml_literals_and_coerced():
    cfg = load_config(JOBS / "pong-ppo.toml", ["run.max_frames=2e6", "optim.lr=1", "algo.epochs=2"])
    assert cfg.run.max_frames == 2_000_000 and isinstance(cfg.run.max_frames, int)
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.algo.name == "ppo" and cfg.algo.epochs == 2


@pytest.mark.parametrize("override, message", [
    ("run.max_frames=2.5", "config key run.max_frames: expected int"),
    ("algo.name=dqn", "config key algo.name: 'dqn' is not one of a2c, ppo"),
    ("algo.gae_lambda=1.5", "config key algo.gae_lambda: 1.5 is out of range"),
    ("node.mode=ba3c", "config key algo.name: 'ppo' needs node.mode = 'a2c'"),
    ("algo.minibatches=100000", "config key algo.minibatches: more minibatches than data points"),
    ("env.size=20", "config key env.size: 20 is out of range"),
    ("optim.max_grad_norm=-1", "config key optim.max_grad_norm: -1.0 is out of range"),
    ("algo.bogus=1", "unknown config key 'algo.bogus'"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(DdrlError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(JOBS / "pong-ppo.toml", [override])


def test_ps_mode_refuses_a_learning_rate_schedule():
    with pytest.raises(DdrlError, match="optim.lr_schedule"):
        load_config(JOBS / "pong-ppo.toml", ["sync.mode=ps", "sync.ps=1"])
