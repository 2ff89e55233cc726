"""Run directories in-process, on real files: what a new run or a resume may use."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddrl.config import load_config
from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint, prepare
from ddrl.rundir.log import RunLog

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def a_run(run_dir: Path, restarts_logged: int = 0) -> None:
    """A run as `ddrl train` leaves it: config, log, one checkpoint (of restart 0)."""
    cfg = load_config(JOBS / "cartpole.toml")
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(cfg.to_toml())
    log = RunLog.create(run_dir / "log.h5", {"config": cfg.to_json()})
    log.close()
    if restarts_logged:
        RunLog.resume(run_dir / "log.h5", 0, 0, restarts_logged, {}).close()
    checkpoint.save(run_dir / "checkpoints", checkpoint.Checkpoint(
        5, 500, 1.0, 0, np.zeros(3, np.float32), []), keep=3)


def test_a_new_run_beside_an_earlier_runs_checkpoints_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    a_run(run_dir)
    (run_dir / "log.h5").unlink()
    with pytest.raises(DdrlError, match="holds an earlier run's checkpoints"):
        prepare(run_dir, False, False, load_config(JOBS / "cartpole.toml"))


def test_a_resume_with_another_model_or_game_names_what_differs(tmp_path):
    run_dir = tmp_path / "run"
    a_run(run_dir)
    other = load_config(JOBS / "cartpole.toml", ["model.hidden=[32,32]"])
    with pytest.raises(DdrlError, match=r"model.hidden \[64, 64\] in the run, \[32, 32\] now"):
        prepare(run_dir, True, False, other)
    with pytest.raises(DdrlError, match="env.id 'CartPole-v1' in the run, 'ALE/Pong-v5' now"):
        prepare(run_dir, True, False, load_config(JOBS / "pong-ppo.toml"))
    ok = load_config(JOBS / "cartpole.toml", ["optim.lr=1e-4", "run.max_frames=10000000"])
    assert prepare(run_dir, True, False, ok).update == 5


def test_restarts_count_resumes_from_one_checkpoint(tmp_path):
    """The log says restart 2 began from this checkpoint (restart 0's) and failed before
    its own: the next start is restart 3, with streams of its own."""
    run_dir = tmp_path / "run"
    a_run(run_dir, restarts_logged=2)
    assert prepare(run_dir, True, False, load_config(JOBS / "cartpole.toml")).restarts == 2


def test_the_temporary_files_of_writes_cut_short_are_removed_and_nothing_else(tmp_path, capsys):
    from ddrl.rundir import remove_leftovers

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / ".ckpt-0000000010.npz.tmp").write_bytes(bytes(2**20))
    (ckpts / ".replay-rank0.npz.tmp").write_bytes(b"x")
    (tmp_path / "log.h5.tmp").write_bytes(b"x")
    keep = [ckpts / "ckpt-0000000009.npz", tmp_path / "log.h5", tmp_path / "notes.tmp"]
    for path in keep:
        path.write_bytes(b"kept")
    outside = tmp_path.parent / "outside.txt"
    outside.write_text("not ours")
    (ckpts / ".link.tmp").symlink_to(outside)
    assert remove_leftovers(tmp_path) == 4
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["checkpoints", *(p.name for p in keep)])
    assert outside.read_text() == "not ours"
    assert "removed 4 temporary file(s) of writes cut short (1.0 MiB)" in capsys.readouterr().err
    assert remove_leftovers(tmp_path) == 0
