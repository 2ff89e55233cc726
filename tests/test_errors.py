"""Bad input gets one clear line naming the problem, exit code 2, no traceback, no data lost."""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import DDRL, JOBS, NO_EVAL, ROOT, ddrl, env_for_tests, table

from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at `where` for the block (root only, as in CI)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", where], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=True)


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
    ("acting.n_sim=four", ["acting.n_sim", "expected int"]),
    ("optim.lr=-0.1", ["optim.lr", "out of range"]),
    ("optim.beta2=1.5", ["optim.beta2", "out of range"]),
    ("acting.mode=a3c", ["acting.mode", "not one of"]),
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
                               timeout=60), "no intact checkpoint")
    assert_one_line_error(ddrl("eval", run_dir / "checkpoints" / "ckpt-0000000001.npz",
                               timeout=60), "checkpoint")


def test_existing_run_is_not_overwritten(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=2000",
               *NO_EVAL, timeout=120)
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


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=2000",
               *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    ckpts = run_dir / "checkpoints"
    good = {p.name: p.read_bytes() for p in ckpts.glob("ckpt-*.npz")}
    # lr 1e99: the first update sends the weights to Inf, every gradient after is NaN.
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume",
               "--set", "optim.lr=1e99", "--set", "run.max_frames=1000000", "--set", "run.log_every=1",
               *NO_EVAL, timeout=120)
    assert res.returncode == 5, (res.returncode, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddrl: error: the last 10 updates had NaN"), lines
    assert max(good) in lines[0], lines[0]
    # Nothing written before is lost or replaced by diverged weights.
    assert {p.name: p.read_bytes() for p in ckpts.glob("ckpt-*.npz")} == good
    train = table(run_dir, "train")
    # The first resumed update was finite (and applied); the 10 after it were dropped.
    assert train["nonfinite"].sum() == 10 and train["nonfinite"][-10:].tolist() == [1] * 10


def test_unwritable_run_directory_is_refused_before_anything_starts(tmp_path):
    notdir = tmp_path / "file"
    notdir.write_text("")
    assert_one_line_error(ddrl("train", JOBS / "cartpole.toml", "--out", notdir / "run", timeout=60),
                          "cannot write there", "Not a directory")
    with tmpfs(tmp_path / "ro", "ro") as ro:
        assert_one_line_error(ddrl("train", JOBS / "cartpole.toml", "--out", ro / "run", timeout=60),
                              "cannot write there", "Read-only file system")


def test_a_damaged_checkpoint_is_named_and_resume_takes_the_previous_intact_one(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=3000",
               "--set", "run.checkpoint_minutes=0.0001", *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    *_, older, newest = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"))
    newest.write_bytes(newest.read_bytes()[:len(newest.read_bytes()) // 2])
    assert_one_line_error(ddrl("eval", newest, timeout=60), newest.name, "damaged")
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume",
               "--set", "run.max_frames=4000", *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"resuming from {older.name}" in res.stderr and newest.name in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    resumed_at = int(older.stem.split("-")[1])
    assert f"resumed at update {resumed_at}" in res.stdout, res.stdout


@pytest.mark.parametrize("override, needle", [
    ("sync.backend=none", "2 ranks but sync.backend = 'none'"),
    ("acting.n_sim=0", "config key acting.n_sim"),
    ("sync.ps=2", "sync.ps = 2 needs at least 3 ranks"),
    (None, "already holds a run: pass --resume"),
])
def test_an_error_every_rank_reaches_is_reported_once_under_mpirun(override, needle, run_dir):
    """Not once per rank inside Open MPI's MPI_ABORT banners: the first rank says it, every
    rank exits 2 before TensorFlow starts. `None`: --out holds an earlier run, kept as it was."""
    earlier = b"an earlier run's log"
    if override is None:
        run_dir.mkdir(parents=True)
        (run_dir / "log.h5").write_bytes(earlier)
    sets = [] if override is None else ["--set", override]
    sets += ["--set", "sync.mode=ps"] if override and override.startswith("sync.ps") else []
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *sets, ranks=2, timeout=120)
    assert res.returncode != 0
    out = res.stdout + res.stderr
    errors = [line for line in out.splitlines() if line.startswith("ddrl: error:")]
    assert len(errors) == 1 and needle in errors[0], out
    assert "MPI_ABORT" not in out and "Traceback" not in out, out
    if override is None:
        assert (run_dir / "log.h5").read_bytes() == earlier
    else:
        assert not (run_dir / "log.h5").exists()


def _absent(package: str, leg: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is not None,
                              reason=f"{package} is installed ({leg})")


@pytest.mark.newest_stack
@pytest.mark.parametrize("setting, message", [
    pytest.param("sync.backend=horovod", "Horovod is not installed",
                 marks=_absent("horovod", "the newest stack's leg has none"), id="horovod"),
    pytest.param("run.wandb=proj", "pip install 'ddrl[wandb]'",
                 marks=_absent("wandb", "the newest stack's leg has it"), id="wandb"),
])
def test_an_extra_asked_for_but_not_installed_is_one_line(setting, message, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", setting,
               ranks=2, timeout=120)
    assert res.returncode == 2
    out = res.stdout + res.stderr
    errors = [line for line in out.splitlines() if line.startswith("ddrl: error:")]
    assert len(errors) == 1 and message in errors[0], out
    assert "Traceback" not in out and not (run_dir / "log.h5").exists(), out


def test_two_runs_on_one_directory_at_once_one_is_refused(run_dir):
    """Started together on one --out, exactly one run proceeds; the other names the holder."""
    args = [*DDRL, "train", str(JOBS / "cartpole.toml"), "--out", str(run_dir),
            "--set", "run.max_frames=6000", *NO_EVAL]
    procs = [subprocess.Popen(args, cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=240) for p in procs]
    codes = sorted(p.returncode for p in procs)
    # Refused by the lock (exit 6: in use, retryable), or where the first run ended before the
    # second started by its log (exit 2: final).
    assert codes in ([0, 6], [0, 2]), results
    refused = next(err for (_, err), p in zip(results, procs) if p.returncode)
    assert refused.startswith("ddrl: error: ") and str(run_dir) in refused, refused
    expected = "in use by another run (pid" if codes[1] == 6 else "already holds a run"
    assert expected in refused, refused
    assert len(list((run_dir / "checkpoints").glob("ckpt-*"))) == 1


def test_a_full_disk_is_one_line_and_keeps_the_log_and_checkpoints(tmp_path):
    """A quota or a full scratch file system mid-run: HDF5 crashed the process before."""
    # The log and TensorBoard fill the disk at ~50 kB/s after ~350 kB at start; a checkpoint every
    # 0.6 s lands long before 1.2 MB is full however fast the CPU (at 600 kB and every 3 s the
    # disk could fill before the first checkpoint).
    with tmpfs(tmp_path / "disk", "size=1200k") as disk:
        run_dir = disk / "run"
        res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_minutes=3",
                   "--set", "run.checkpoint_minutes=0.01", "--set", "eval.target=none",
                   timeout=300)
        assert_one_line_error(res, "No space left on device", str(run_dir))
        assert len(table(run_dir, "train")) > 0  # what was flushed reads
        saved = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"))
        assert saved and all(checkpoint.load(p).update > 0 for p in saved)
        assert not list((run_dir / "checkpoints").glob(".*.tmp"))


@pytest.mark.parametrize("megabytes", [0.3, 2])
def test_a_checkpoint_that_does_not_fit_fails_cleanly_wherever_the_disk_fills(tmp_path,
                                                                              megabytes):
    """The disk (1 MiB) filling in the first array or in the fourth: one error, the temporary
    file gone, and nothing left to print a traceback when it is collected (np.savez did)."""
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with tmpfs(tmp_path / "disk", "size=1m") as disk:
            arrays = {f"a{i}": np.ones(int(megabytes * 2**20) // 8) for i in range(4)}
            with pytest.raises(DdrlError, match="No space left on device"):
                checkpoint.write_arrays(disk / "ckpt.npz", arrays)
            gc.collect()
            assert list(disk.iterdir()) == []
    finally:
        sys.unraisablehook = hook
    assert unraisable == []


def test_a_resume_that_does_not_fit_the_run_names_the_key_and_writes_nothing(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=2000",
               *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    def files() -> dict:
        # .lock names whichever process held the directory last: the refused run, briefly;
        # its .lock.owner it removes.
        return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    assert_one_line_error(ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume",
                               "--set", "model.hidden=[32,32]", timeout=60),
                          "model.hidden [64, 64] in the run, [32, 32] now")
    assert_one_line_error(ddrl("train", JOBS / "pong-ppo.toml", "--out", run_dir, "--resume",
                               timeout=60), "env.id 'CartPole-v1' in the run, 'ALE/Pong-v5' now")
    assert files() == before


def test_a_damaged_log_is_reported_and_a_resume_sets_it_aside(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.max_frames=6000",
               *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    log = run_dir / "log.h5"
    with h5py.File(log, "r") as f:
        offset = f["episodes"].id.get_chunk_info(0).byte_offset
    data = bytearray(log.read_bytes())
    data[offset:offset + 64] = np.random.default_rng(0).bytes(64)
    log.write_bytes(bytes(data))
    assert_one_line_error(ddrl("analyze", run_dir, timeout=60), "table /episodes", "damaged")
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume",
               "--set", "run.max_frames=8000", *NO_EVAL, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "set aside as log.damaged-1.h5" in res.stderr, res.stderr
    assert (run_dir / "log.damaged-1.h5").read_bytes() == bytes(data)
    starts = table(run_dir, "starts")
    assert starts["restart"].tolist() == [0, 1] and starts["damaged_log"].tolist() == [0, 1]
    assert len(table(run_dir, "train")) > 0 and len(table(run_dir, "episodes")) > 0


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for the signal now (its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_stop_signal_during_start_up_checkpoints_and_exits_resumable(run_dir):
    """Slurm's warning while TensorFlow still loads: a checkpoint at the first update and exit
    3, not the default action's death."""
    proc = subprocess.Popen([*DDRL, "train", str(JOBS / "cartpole.toml"), "--out", str(run_dir),
                             *NO_EVAL], cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not catches(proc.pid, signal.SIGUSR1):
        assert proc.poll() is None
        time.sleep(0.01)
    assert not (run_dir / "log.h5").exists()  # still starting
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "stopped (signal) after 1 updates" in out, out
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).update == 1
