"""Weights & Biases, offline: a run mirrors its log's scalars into a W&B run of its own, and a
resume continues that run. Runs where the `wandb` extra is installed (the newest stack's leg)."""
from __future__ import annotations

import re

import pytest
from conftest import JOBS, ddrl, env_for_tests, table

pytestmark = pytest.mark.newest_stack
pytest.importorskip("wandb")


def offline_runs(run_dir) -> list:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def test_a_run_mirrors_its_log_into_an_offline_wandb_run_and_a_resume_continues_it(run_dir):
    env = {**env_for_tests(), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    sets = ["--set", "run.wandb=ddrl-test", "--set", "eval.every=20", "--set", "eval.target=none"]
    first = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *sets,
                 "--set", "run.max_frames=10000", env=env, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    [run] = offline_runs(run_dir)
    data = next(run.glob("run-*.wandb")).read_bytes()
    # Every row of the log's tables is there under its TensorBoard tag.
    for tag, name in ((b"train/loss", "train"), (b"eval/mean_return", "eval"),
                      (b"episodes/return", "episodes")):
        assert data.count(tag) >= len(table(run_dir, name)) > 0, tag
    again = ddrl("train", run_dir / "config.toml", "--out", run_dir, "--resume", *sets,
                 "--set", "run.max_frames=20000", env=env, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    ids = {re.sub(r"^offline-run-\d+_\d+-", "", r.name) for r in offline_runs(run_dir)}
    assert len(offline_runs(run_dir)) == 2 and len(ids) == 1, offline_runs(run_dir)
