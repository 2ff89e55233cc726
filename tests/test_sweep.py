"""`ddrl sweep`: a sweep file's runs one after another under real mpirun; stopped by a signal,
the same command resumes the interrupted run and skips the finished ones."""
from __future__ import annotations

import signal
import subprocess
import time

from conftest import DDRL, JOBS, NO_EVAL, ROOT, ddrl, env_for_tests, table, wait_for_updates

from ddrl.commands.sweep import FINISHED
from ddrl.config import load_config
from ddrl.rundir import checkpoint, held_by_a_run


def test_a_sweep_runs_each_line_resumes_after_a_signal_and_skips_finished_runs(tmp_path):
    sweep = tmp_path / "seeds.sweep"
    sweep.write_text("# two seeds, the second with a longer budget\n"
                     "run.seed=0\n\nrun.seed=1 run.max_frames=100000  # longer\n")
    out = tmp_path / "runs" / "cp"
    args = ["sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", out, "--ranks", "2",
            "--set", "run.max_frames=4000", "--set", "run.log_every=1", *NO_EVAL]
    proc = subprocess.Popen([*DDRL, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env_for_tests())
    try:
        # Run 0 ends on its budget; run 1 is stopped part way, as by a reboot's SIGTERM.
        wait_for_updates(proc, tmp_path / "runs" / "cp_1", 5)
        proc.send_signal(signal.SIGTERM)
        first, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 3, first[-3000:]
    assert (tmp_path / "runs" / "cp_0" / FINISHED).exists()
    assert not (tmp_path / "runs" / "cp_1" / FINISHED).exists()
    assert "stopped during run 1; the same command resumes it" in first
    stopped_at = table(tmp_path / "runs" / "cp_1", "train")["frames"][-1]
    assert stopped_at < 100000

    again = ddrl(*args, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "run 0 of 2 (run.seed=0): finished already" in again.stdout
    assert "(resuming)" in again.stderr
    train = table(tmp_path / "runs" / "cp_1", "train")
    assert train["frames"][-1] >= 100000 and table(tmp_path / "runs" / "cp_1", "starts").shape[0] == 2
    assert (tmp_path / "runs" / "cp_1" / FINISHED).exists()


def test_a_bad_line_is_refused_before_any_run_starts(tmp_path):
    sweep = tmp_path / "bad.sweep"
    sweep.write_text("run.seed=0\nrun.sede=1\n")
    res = ddrl("sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", tmp_path / "r",
               timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("ddrl: error:") and "run.sede" in res.stderr, res.stderr
    assert not (tmp_path / "r_0").exists()


def test_array_runs_only_the_lines_it_names_into_their_own_directories(tmp_path):
    """`ddrl sweep --array` picks lines as `sbatch --array` picks tasks: a sweep split over
    machines, or one line run again, lands where the whole sweep would have put it."""
    sweep = tmp_path / "seeds.sweep"
    sweep.write_text("run.seed=0\nrun.seed=1\nrun.seed=2\n")
    out = tmp_path / "cp"
    args = ["sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", out, "--ranks", "1",
            "--set", "run.max_frames=2000", *NO_EVAL]
    for array, message in (("3", "the sweep file has 3 runs (tasks 0-2)"),
                           ("0-2%2", "runs one run at a time")):
        res = ddrl(*args, "--array", array, timeout=60)
        assert res.returncode == 2 and res.stderr.startswith("ddrl: error: --array"), res.stderr
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("cp_*"))

    res = ddrl(*args, "--array", "2", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "run 2 of 3 (run.seed=2)" in res.stdout and "run 0 " not in res.stdout
    assert [p.name for p in tmp_path.glob("cp_*")] == ["cp_2"]
    assert (tmp_path / "cp_2" / FINISHED).exists()
    assert load_config(tmp_path / "cp_2" / "config.toml").run.seed == 2
    assert table(tmp_path / "cp_2", "train")["update"][-1] > 0


def test_a_line_with_an_unbalanced_quote_is_one_line_naming_it(tmp_path):
    sweep = tmp_path / "quote.sweep"
    sweep.write_text("run.seed=0\nrun.seed=1 'optim.lr=1e-3\n")
    res = ddrl("sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", tmp_path / "r",
               timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"sweep file {sweep}, line 2: No closing quotation" in res.stderr


def test_an_edited_sweep_file_does_not_resume_a_run_with_another_lines_settings(tmp_path):
    sweep = tmp_path / "s.sweep"
    sweep.write_text("run.seed=0\n")
    out = tmp_path / "r"
    args = ["sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", out, "--ranks", "1",
            "--set", "run.max_frames=2000", *NO_EVAL]
    assert ddrl(*args, timeout=240).returncode == 0
    (out.parent / "r_0" / FINISHED).unlink()  # as if it had been stopped part way
    sweep.write_text("run.seed=7\n")
    res = ddrl(*args, timeout=240)
    assert res.returncode == 2
    assert "holds the run of another line ('run.seed=0 --set=run.max_frames=2000" in res.stdout


def test_a_second_sweep_on_one_out_is_in_use_and_a_killed_sweep_stops_its_run(tmp_path):
    """The sweep's runs die with it (SIGKILL leaves it no handler: the kernel's parent-death
    signal reaches mpirun as SIGUSR1, and the run checkpoints and stops); while it lives a
    second sweep on the same --out is refused as in use (exit 6), not counted as failed."""
    sweep = tmp_path / "s.sweep"
    sweep.write_text("run.seed=0\n")
    out = tmp_path / "r"
    args = ["sweep", JOBS / "cartpole.toml", "--sweep", sweep, "--out", out, "--ranks", "1",
            "--set", "run.max_frames=100000000", "--set", "run.log_every=1", *NO_EVAL]
    proc = subprocess.Popen([*DDRL, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env_for_tests())
    try:
        wait_for_updates(proc, tmp_path / "r_0", 5)
        second = ddrl(*args, timeout=120)
        assert second.returncode == 6, second.stdout + second.stderr
        assert "in use by another run" in second.stderr
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and held_by_a_run(tmp_path / "r_0"):
            time.sleep(0.5)
        assert not held_by_a_run(tmp_path / "r_0"), "the run outlived its sweep"
    finally:
        proc.kill()
    starts = table(tmp_path / "r_0", "starts")
    assert len(starts) == 1
    assert checkpoint.latest(tmp_path / "r_0" / "checkpoints") is not None  # it checkpointed
