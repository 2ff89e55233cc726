"""The run directory's hold: flock where the filesystem has it, and a heartbeat lock file that
works where flock is unsupported or local to one node."""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import sys
import time

import pytest

from ddrl import rundir
from ddrl.errors import DdrlError, InUseError
from ddrl.rundir import OWNER, STALE_S, held_by_a_run, hold


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem that refuses flock (Lustre without -o flock: ENOSYS). This machine has
    none to mount, so the refusal is the kernel's answer played back."""
    def refuse(f, op):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    monkeypatch.setattr(fcntl, "flock", refuse)


def test_without_flock_the_lock_file_holds_the_directory_and_says_so_once(tmp_path, no_flock,
                                                                         capsys):
    held = hold(tmp_path)
    assert capsys.readouterr().err.count("without flock") == 1
    assert held_by_a_run(tmp_path)
    with pytest.raises(InUseError, match=f"pid {os.getpid()} on {socket.gethostname()}"):
        hold(tmp_path)
    held.close()
    assert not (tmp_path / OWNER).exists() and not held_by_a_run(tmp_path)
    hold(tmp_path).close()


def test_a_second_process_is_refused_with_its_own_exit_code_while_the_first_lives(tmp_path):
    """Exit 6 ("in use", retryable), not 2 (bad input, final)."""
    first = hold(tmp_path)
    code = ("import sys; from ddrl.rundir import hold; from ddrl.errors import DdrlError, InUseError\n"
            "try:\n    hold(__import__('pathlib').Path(sys.argv[1]))\n"
            "except InUseError as e:\n    print(e); sys.exit(e.exit_code)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    first.close()
    assert out.returncode == 6, out.stdout + out.stderr
    assert "in use by another run" in out.stdout


def test_a_lock_file_whose_owner_is_gone_is_taken_over(tmp_path, no_flock):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / OWNER).write_text(f"pid {dead.pid} on {socket.gethostname()}\n")
    assert not held_by_a_run(tmp_path)
    hold(tmp_path).close()
    # Another host's run whose heartbeat stopped (its node lost) STALE_S ago.
    (tmp_path / OWNER).write_text("pid 1 on some-other-node\n")
    assert held_by_a_run(tmp_path)
    old = time.time() - STALE_S - 1
    os.utime(tmp_path / OWNER, (old, old))
    hold(tmp_path).close()


def test_the_heartbeat_renews_the_lock_file(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "HEARTBEAT_S", 0.05)
    held = hold(tmp_path)
    old = time.time() - 100
    os.utime(tmp_path / OWNER, (old, old))
    time.sleep(0.3)
    assert time.time() - (tmp_path / OWNER).stat().st_mtime < 5
    held.close()


def test_a_symlink_planted_as_the_lock_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(DdrlError, match="cannot lock it"):
        hold(run)
    assert target.read_text() == "keep"


def test_status_of_a_held_directory_whose_log_cannot_be_read_is_running_not_damaged(tmp_path):
    """A log read from another node while it is written can look torn for a moment (NFS,
    Lustre): a run that holds its directory is running, and the log is said to be unreadable
    now, not damaged."""
    from analysis.status import line

    (tmp_path / "log.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    lock = hold(tmp_path)
    try:
        held = line(tmp_path)
    finally:
        lock.close()
    assert held[1] == "running" and "cannot be read now" in held[2], held
    assert line(tmp_path)[1] == "damaged"  # once nobody holds it
