"""Bad input gets one clear line naming the problem, exit code 2, no traceback, no data lost."""
from __future__ import annotations

import pytest
from conftest import JOBS, ddrl


def assert_one_line_error(res, *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ddrl: error:"), lines[0]
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("override, needles", [
    ("node.n_simulators=4", ["node.n_simulators", "unknown"]),
    ("nodes.n_sim=4", ["nodes.n_sim", "unknown"]),
    ("node.n_sim=four", ["node.n_sim", "expected int"]),
    ("optim.lr=-0.1", ["optim.lr", "out of range"]),
    ("optim.beta2=1.5", ["optim.beta2", "out of range"]),
    ("node.mode=a3c", ["node.mode", "not one of"]),
    ("env.id=ALE/NoSuchGame-v5", ["env.id", "NoSuchGame"]),
    ("env.id=Pong", ["env.id", "ALE/Pong-v5"]),
    ("sync.backend=gloo", ["sync.backend"]),
])
def test_bad_config_value(override, needles, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", override, timeout=60)
    assert_one_line_error(res, *needles)
    assert not run_dir.exists()


def test_bad_job_files(tmp_path):
    bad_key = tmp_path / "bad_key.toml"
    bad_key.write_text('[env]\nid = "CartPole-v1"\nstickyness = 0.1\n')
    assert_one_line_error(ddrl("train", bad_key, timeout=60), "env.stickyness")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[env\nid = 3\n")
    assert_one_line_error(ddrl("train", bad_toml, timeout=60), "not valid TOML")
    assert_one_line_error(ddrl("train", tmp_path / "missing.toml", timeout=60), "missing.toml")


def test_missing_checkpoint(run_dir):
    assert_one_line_error(ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume",
                               timeout=60), "no checkpoint")
    assert_one_line_error(ddrl("eval", run_dir / "checkpoints" / "ckpt-0000000001.npz",
                               timeout=60), "checkpoint")


def test_existing_run_is_not_overwritten(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=2000",
               "--set", "eval.episodes=0", timeout=120)
    assert res.returncode == 0, res.stderr
    before = (run_dir / "log.h5").read_bytes()
    again = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, timeout=60)
    assert_one_line_error(again, "--resume")
    assert (run_dir / "log.h5").read_bytes() == before


def test_world_mismatch_with_slurm(run_dir):
    """srun without PMIx starts singletons: Slurm says 2 tasks, MPI sees 1."""
    from conftest import env_for_tests

    env = env_for_tests()
    env.update(SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="0", SLURM_JOB_ID="7")
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, env=env, timeout=60)
    assert_one_line_error(res, "2 tasks", "1 rank")
