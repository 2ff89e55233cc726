"""Storage errors that may pass (an NFS server failing over: EIO, ESTALE; a Lustre client
reconnecting: ENOTCONN), met by a real `ddrl train` on a FUSE filesystem that returns them
(tests/faulty_fs.py): a checkpoint is tried again, the run keeps its last good checkpoint and
exits resumable (7), never final (2)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DDRL, JOBS, NO_EVAL, ROOT, ddrl, env_for_tests, table

from ddrl import checkpoint

FAST = ["--set", "run.checkpoint_minutes=0.002", "--set", "run.storage_retry_seconds=1",
        *NO_EVAL]


@pytest.fixture
def faulty(tmp_path) -> Iterator[tuple[Path, Path]]:
    """(mount point, control file) of a faulty filesystem over tmp_path/backing."""
    if os.geteuid() != 0:
        pytest.skip("mounting a FUSE filesystem needs root")
    backing, mount, control = tmp_path / "backing", tmp_path / "mnt", tmp_path / "control"
    backing.mkdir()
    mount.mkdir()
    proc = subprocess.Popen([sys.executable, Path(__file__).with_name("faulty_fs.py"), backing,
                             mount, control], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not os.path.ismount(mount):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the FUSE filesystem did not mount"
        time.sleep(0.1)
    try:
        yield mount, control
    finally:
        subprocess.run(["umount", "-l", mount], check=False)
        proc.wait(timeout=30)


def fail(control: Path, code: int, count: int, where: str) -> None:
    control.write_text(f"{code} {count} {where}")


def failures(control: Path) -> list[str]:
    log = control.with_name(control.name + ".log")
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE])
def test_a_checkpoint_whose_write_fails_once_is_written_again_and_the_run_ends_well(
        faulty, code):
    mount, control = faulty
    fail(control, code, 1, "ckpt-")
    run_dir = mount / "run"
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set",
               "run.max_frames=3000", *FAST, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(failures(control)) == 1, failures(control)
    assert "trying again in 1 s" in res.stderr and "Traceback" not in res.stderr, res.stderr
    newest = checkpoint.latest(run_dir / "checkpoints")
    assert checkpoint.load(newest).frames >= 3000


def test_checkpoints_that_keep_failing_end_the_run_resumable_with_the_last_good_one(faulty):
    """The fault begins once a checkpoint is on disk and does not pass: the periodic write
    fails twice (it and its retry), the run trains on with a warning; the next fails too and
    the run ends, exit 7, its log and its last good checkpoint intact. Once the fault has
    passed, the run resumes from that checkpoint."""
    mount, control = faulty
    run_dir = mount / "run"
    proc = subprocess.Popen([*DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, "--set",
                             "run.max_minutes=3", "--set", "run.max_frames=10000000", *FAST],
                            cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while checkpoint.latest(run_dir / "checkpoints") is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    fail(control, errno.EIO, -1, "ckpt-")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 7, (proc.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("ddrl: error: ") and "may pass" in lines[-1], err
    assert any("training goes on from the last good checkpoint" in line for line in lines), err
    assert "Traceback" not in err
    good = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    assert good.update > 0
    assert len(table(run_dir, "episodes")) > 0
    control.write_text("")
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume", "--set",
               f"run.max_frames={good.frames + 2000}", *FAST, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"resumed at update {good.update}" in res.stdout, res.stdout


def test_a_log_write_that_fails_with_an_error_that_may_pass_ends_the_run_resumable(faulty):
    mount, control = faulty
    run_dir = mount / "run"
    proc = subprocess.Popen([*DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, "--set",
                             "run.max_minutes=3", "--set", "run.max_frames=10000000", *FAST],
                            cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while checkpoint.latest(run_dir / "checkpoints") is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    fail(control, errno.ENOTCONN, -1, "log.h5")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 7, (proc.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("ddrl: error: ") and "writing the log failed" in lines[-1], err
    assert "may pass" in lines[-1] and "Traceback" not in err, err
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update > 0
