"""Storage errors that may pass (an NFS server failing over: EIO, ESTALE; a Lustre client
reconnecting: ENOTCONN), met by a real `ddrl train` on a FUSE filesystem that returns them
(tests/faulty_fs.py): a checkpoint is tried again, the run keeps its last good checkpoint and
exits resumable (7), never final (2)."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DDRL, JOBS, NO_EVAL, ROOT, ddrl, env_for_tests, table

from ddrl.rundir import checkpoint

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


def fail(control: Path, code: int, count: int, where: str, ops: str = "write,fsync,rename"
         ) -> None:
    control.write_text(f"{code} {count} {where} {ops}")


def failures(control: Path) -> list[str]:
    log = control.with_name(control.name + ".log")
    return log.read_text().splitlines() if log.exists() else []


def start_with_a_checkpoint(run_dir: Path) -> subprocess.Popen:
    """A CartPole run of up to 3 minutes, once its first checkpoint is on disk."""
    proc = subprocess.Popen([*DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, "--set",
                             "run.max_minutes=3", "--set", "run.max_frames=10000000", *FAST],
                            cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while checkpoint.latest(run_dir / "checkpoints") is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc


def ended_resumable(proc: subprocess.Popen) -> list[str]:
    """The run's stderr lines, once it has ended with exit 7 on one error line that says the
    fault may pass, and no traceback."""
    _, err = proc.communicate(timeout=240)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 7 and "Traceback" not in err, (proc.returncode, err)
    assert lines[-1].startswith("ddrl: error: ") and "may pass" in lines[-1], err
    return lines


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
    proc = start_with_a_checkpoint(run_dir)
    fail(control, errno.EIO, -1, "ckpt-")
    lines = ended_resumable(proc)
    assert any("training goes on from the last good checkpoint" in line for line in lines), lines
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
    proc = start_with_a_checkpoint(run_dir)
    fail(control, errno.ENOTCONN, -1, "log.h5")
    assert "writing the log failed" in ended_resumable(proc)[-1]
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update > 0


def test_status_says_cannot_tell_when_the_lock_file_cannot_be_read(faulty):
    """From another node (the run's flock is out of sight) with a stale file handle on the
    run directory's lock files: neither "killed" nor a traceback, but "cannot tell"; once the
    fault passes, "running" again."""
    mount, control = faulty
    run_dir = mount / "run"
    proc = start_with_a_checkpoint(run_dir)
    try:
        fail(control, errno.ESTALE, -1, ".lock", "getattr")
        time.sleep(2)  # past FUSE's 1 s attribute cache
        res = ddrl("status", run_dir, timeout=120)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        state = res.stdout.splitlines()[1].split()[1:3]
        assert state == ["cannot", "tell"], res.stdout
        control.write_text("")
        time.sleep(2)
        res = ddrl("status", run_dir, timeout=120)
        assert res.stdout.splitlines()[1].split()[1] == "running", res.stdout
    finally:
        proc.send_signal(signal.SIGUSR1)
        proc.communicate(timeout=120)


def test_a_run_where_flock_is_refused_writes_and_reads_its_log(tmp_path):
    """Lustre without `-o flock`, NFS without lockd: every flock is ENOSYS (here for the whole
    process, by a preloaded flock). The run takes its lock file alone, HDF5 writes the log
    without its own lock, and `ddrl status` and `analyze` read it."""
    shim = tmp_path / "noflock.so"
    source = tmp_path / "noflock.c"
    source.write_text("#include <errno.h>\n"
                      "int flock(int fd, int op) { (void)fd; (void)op; errno = ENOSYS; "
                      "return -1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", shim, source], check=True)
    env = {**env_for_tests(), "LD_PRELOAD": str(shim)}
    run_dir = tmp_path / "run"
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=3000",
               *NO_EVAL, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "without flock (Function not implemented)" in res.stderr, res.stderr
    res = ddrl("status", run_dir, timeout=120, env=env)
    assert res.stdout.splitlines()[1].split()[1] == "finished", res.stdout + res.stderr
    res = ddrl("analyze", run_dir, "--out", tmp_path / "analysis", timeout=300, env=env)
    assert res.returncode == 0 and (tmp_path / "analysis" / "summary.csv").is_file(), res.stderr
