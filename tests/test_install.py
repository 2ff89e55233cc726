"""A plain (not editable) install works away from the checkout: its package data is there."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOBS, ROOT, env_for_tests


@pytest.mark.newest_stack
def test_an_installed_wheel_renders_batch_scripts_and_reads_references_outside_the_checkout(
        tmp_path: Path):
    wheel_dir, site, src = tmp_path / "wheel", tmp_path / "site", tmp_path / "src"
    # A copy: setuptools builds in the source tree, and a stale build/ there would leak into
    # the wheel.
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # --no-build-isolation: the build backend is already in the venv, and nothing is downloaded.
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheel_dir, src],
                   check=True, capture_output=True, timeout=300)
    wheel, = wheel_dir.glob("ddrl-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel],
                   check=True, capture_output=True, timeout=300)
    env = {**env_for_tests(), "PYTHONPATH": str(site)}
    away = tmp_path / "elsewhere"
    away.mkdir()

    # Every subpackage is in the wheel (one without an __init__.py would be left out).
    where = subprocess.run([sys.executable, "-c", "import ddrl, analysis; print(ddrl.__file__); "
                            "print(analysis.__file__); import ddrl.loop.trainer, "
                            "ddrl.acting.dqn, ddrl.placement.central.actors"],
                           cwd=away, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(Path(p).is_relative_to(site) for p in where.stdout.split()), where.stdout

    script = subprocess.run([sys.executable, "-m", "ddrl", "slurm", JOBS / "cartpole.toml"],
                            cwd=away, env=env, capture_output=True, text=True, timeout=120)
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --ntasks-per-node=" in script.stdout
    # launch.sh is inlined: the printed script needs nothing from the checkout.
    assert "ddrl_main() {" in script.stdout
    assert 'source "$DDRL_SLURM_DIR/launch.sh"' not in script.stdout

    from analysis.reference import load_reference

    shipped = load_reference("pong")
    installed = subprocess.run([sys.executable, "-c", "from analysis.reference import load_reference;"
                                "print(len(load_reference('pong')))"],
                               cwd=away, env=env, capture_output=True, text=True, timeout=60)
    assert installed.stdout.strip() == str(len(shipped)), installed.stderr

    # The recipes come with the package: listed, and run by name away from the checkout.
    listed = subprocess.run([sys.executable, "-m", "ddrl", "recipes", "--paths"], cwd=away,
                            env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    pong = next(line for line in listed.stdout.splitlines() if line.startswith("pong-ppo "))
    assert str(site / "ddrl" / "recipes" / "pong-ppo.toml") in pong, listed.stdout
    trained = subprocess.run([sys.executable, "-m", "ddrl", "train", "pong-ppo", "--out", "r",
                              "--set", "run.max_frames=4096", "--set", "eval.episodes=0",
                              "--set", "eval.target=none"],
                             cwd=away, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "ALE/Pong-v5" in trained.stdout and (away / "r" / "log.h5").is_file()
