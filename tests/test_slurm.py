"""The batch scripts in slurm/ and `ddrl slurm`, on a real one-node Slurm cluster.

The training tests run short CartPole jobs (a few seconds of training each; most of their
time is TensorFlow starting) and check what the scripts promise: where the run directory
is, that a warning signal ends in checkpoint, requeue and resume within one log, that array
tasks get their own directories and seeds, and that a bad job file fails in one line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import NO_EVAL, rank_pid
from slurm_cluster import FINAL_STATES, SlurmCluster, slurm_cluster  # noqa: F401  (the fixture)

from ddrl.cli import main as ddrl_main
from ddrl.rundir import checkpoint

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "slurm"
CARTPOLE = REPO / "jobs" / "cartpole.toml"
# No evaluation episodes: they would only compete with training for the 2 cores.
FAST = NO_EVAL
# One worker of `pytest -n` (Makefile) takes the whole module: one cluster, started once.
pytestmark = pytest.mark.xdist_group("slurm")


def ddrl_slurm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddrl", "slurm", *args], capture_output=True,
                          text=True, timeout=60)


def train_rows(log: Path) -> np.ndarray:
    with h5py.File(log, "r", swmr=True) as f:
        return f["train"][:]


def wait_for_training(cluster: SlurmCluster, job_id: str, log: Path, timeout: float) -> None:
    """Until the run has logged updates: then a signal stops it mid-run, not at startup."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cluster.state(job_id) in ("PENDING", "RUNNING"), cluster.records(job_id)
        try:
            if log.exists() and len(train_rows(log)):
                return
        except OSError:  # the writer has not switched the new file to SWMR yet
            pass
        time.sleep(0.5)
    pytest.fail(f"job {job_id} logged no updates in {timeout} s")


# --- `ddrl slurm`, no cluster needed ----------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (("--set", "run.max_frame=10"), "unknown config key 'run.max_frame'"),
    (("--time", "00:02:00"), "--time 00:02:00 is too short"),
    (("--time", "tomorrow"), "--time 'tomorrow'"),
    (("--array", "0-9%"), "--array '0-9%'"),
    (("--gpus-per-node", "8", "--tasks-per-node", "4"), "one rank per GPU"),
    (("--job-name", "x\nrm -rf ~"), "--job-name 'x\\nrm -rf ~'"),
    (("--partition", "a b"), "--partition 'a b'"),
])
def test_slurm_command_rejects_bad_input(args, message):
    proc = ddrl_slurm(str(CARTPOLE), *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("ddrl: error: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_an_array_longer_than_the_sweep_is_refused(tmp_path):
    sweep = tmp_path / "two.sweep"
    sweep.write_text("run.seed=0\nrun.seed=1\n")
    res = ddrl_slurm(str(CARTPOLE), "--sweep", str(sweep), "--array", "0-2")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "ddrl: error: --array '0-2': the sweep file has 2 runs (tasks 0-1)\n"


def test_gpu_script_gives_each_rank_one_gpu():
    script = ddrl_slurm(str(CARTPOLE), "--gpus-per-node", "4", "--cpus-per-task", "8").stdout
    assert "#SBATCH --ntasks-per-node=4\n" in script and "#SBATCH --gres=gpu:4\n" in script
    # The per-rank GPU choice, run as each rank would run it.
    for visible, local_rank, expected in (("4,5,6,7", "2", "6"), ("3", "1", "3")):
        proc = subprocess.run(
            ["bash", "-c", f'source {SLURM}/launch.sh && bash -c "$DDRL_RANK_SH" rank printenv '
                           "CUDA_VISIBLE_DEVICES"],
            env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": visible,
                 "SLURM_LOCALID": local_rank},
            capture_output=True, text=True, check=True)
        assert proc.stdout.strip() == expected


def resolve(monkeypatch, capsys, env: dict[str, str], *args: str) -> list[str]:
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ddrl_main(["slurm", "--resolve", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_resolve_names_run_directories_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    job = str(CARTPOLE)
    assert resolve(monkeypatch, capsys, {"SLURM_JOB_ID": "77"}, job, "--set", "run.seed=5") == [
        job, "--out", str(tmp_path / "runs/cartpole-77"), "--set", "run.seed=5"]
    # A requeued job (same id) finds its checkpoint.
    (tmp_path / "runs/cartpole-77/checkpoints").mkdir(parents=True)
    (tmp_path / "runs/cartpole-77/checkpoints/ckpt-0000000010.npz").touch()
    assert "--resume" in resolve(monkeypatch, capsys, {"SLURM_JOB_ID": "77"}, job)
    # A start lost before its first checkpoint: the run starts over, its log kept aside.
    lost = tmp_path / "runs/cartpole-78"
    lost.mkdir(parents=True)
    (lost / "log.h5").write_bytes(b"first start")
    for n in (1, 2):
        assert "--resume" not in resolve(monkeypatch, capsys, {"SLURM_JOB_ID": "78"}, job)
        assert not (lost / "log.h5").exists()
        assert (lost / f"log.before-restart-{n}.h5").read_bytes() == b"first start"
        (lost / "log.h5").write_bytes(b"first start")
    # Array tasks: own directory, seed = the job's seed + task id.
    array = {"SLURM_JOB_ID": "81", "SLURM_ARRAY_JOB_ID": "80", "SLURM_ARRAY_TASK_ID": "1"}
    assert resolve(monkeypatch, capsys, array, job, "--set", "run.seed=10") == [
        job, "--out", str(tmp_path / "runs/cartpole-80_1"), "--set", "run.seed=10",
        "--set", "run.seed=11"]
    assert resolve(monkeypatch, capsys, array, job, "--out", "sweep")[2] == str(tmp_path / "sweep_1")
    # Sweeps: task i takes line i, which may name another job file.
    sweep = tmp_path / "sweep.txt"
    sweep.write_text(f"# lr sweep\noptim.lr=1e-3\n\n{job} optim.lr=3e-4 'acting.n_sim=4'  # x\n")
    assert resolve(monkeypatch, capsys, array, str(REPO / "jobs/pong.toml"), "--sweep",
                   str(sweep)) == [job, "--out", str(tmp_path / "runs/cartpole-80_1"),
                                   "--set", "optim.lr=3e-4", "--set", "acting.n_sim=4"]


# --- on the cluster -----------------------------------------------------------------------------

def test_cluster_runs_a_two_task_job(slurm_cluster):
    job = slurm_cluster.submit(None, options=("--ntasks=2",),
                               stdin='#!/bin/bash\nsrun hostname\necho "tasks $SLURM_NTASKS"\n')
    [result] = slurm_cluster.wait(job, timeout=60)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), result.text()
    assert "tasks 2" in result.text()


@pytest.mark.parametrize("args", [(), ("--array", "0-3%2", "--mem", "1G"),
                                  ("--nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "2",
                                   "--time", "1-00:00:00", "--partition", "debug")])
def test_printed_script_is_accepted_by_sbatch(slurm_cluster, args):
    script = ddrl_slurm(str(CARTPOLE), *args)
    assert script.returncode == 0, script.stderr
    proc = slurm_cluster.run("sbatch", "--test-only", input=script.stdout, check=False)
    assert proc.returncode == 0, proc.stderr


def test_train_script_two_ranks(slurm_cluster, tmp_path):
    out = tmp_path / "run"
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_frames=8000", *FAST)
    [result] = slurm_cluster.wait(job, timeout=150)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), result.text()
    assert f"ddrl: run directory {out}\n" in result.text()
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        assert f.attrs["world_size"] == 2
        assert len(f["train"])
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).frames >= 8000


def warn_and_resume(cluster: SlurmCluster, out: Path, options: tuple[str, ...] = ()
                    ) -> tuple[str, np.ndarray, np.ndarray]:
    """A job that gets the time-limit warning mid-run; it must checkpoint, requeue, resume and
    complete. Its output, `/train` and `/starts` rows."""
    # Long enough (about 15 s of training here) that the run cannot end before the signal
    # arrives, even on a loaded machine: at 24,000 frames it sometimes did.
    job = cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                         "--set", "run.max_frames=120000", *FAST, options=options)
    wait_for_training(cluster, job, out / "log.h5", timeout=120)
    # What Slurm sends 120 s before the time limit (--signal=B:USR1@120).
    cluster.run("scancel", "--signal=USR1", "--batch", job)
    [result] = cluster.wait(job, timeout=240)
    text = result.text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text
    assert result.restarts >= 1 and f"requeueing job {job}" in text and "(resuming)" in text, text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        assert f.attrs["restarts"] >= 1
        rows, starts = f["train"][:], f["starts"][:]
    updates = rows["update"]
    assert np.all(np.diff(updates) > 0), f"duplicated or unordered updates: {updates}"
    assert set(rows["restart"]) >= {0, 1}, "the log should hold rows from before and after"
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).frames >= 120000
    # The requeue was marked for `ddrl status`, and the resumed run's log is newer than it.
    assert (out / "requeued").read_text().split() == [job]
    assert (out / "requeued").stat().st_mtime <= (out / "log.h5").stat().st_mtime
    return text, rows, starts


def test_warning_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    _, _, starts = warn_and_resume(slurm_cluster, tmp_path / "run")
    assert list(starts["restart"][:2]) == [0, 1] and list(starts["world_size"][:2]) == [2, 2]


def test_a_warning_during_the_final_evaluation_checkpoints_requeues_and_completes(
        slurm_cluster, tmp_path):
    """The run's own budget ends close to the allocation's: Slurm's warning arrives while
    rank 0 plays its final evaluation. The final checkpoint is already written (before
    anything long); the evaluation stops, the job requeues, and the resume plays it."""
    out = tmp_path / "run"
    # So few frames that the greedy policy is still about the initial one, whose games are
    # about as short every run: the evaluation's length does not hang on what was learned.
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_frames=1000", "--set", "eval.target=none",
                               "--set", "eval.episodes=10000", "--set", "eval.every=1000000")
    deadline = time.monotonic() + 120
    while (path := checkpoint.latest(out / "checkpoints")) is None or \
            checkpoint.load(path).frames < 1000:
        assert time.monotonic() < deadline and slurm_cluster.state(job) in ("PENDING", "RUNNING")
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    [result] = slurm_cluster.wait(job, timeout=300)
    text = result.text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text
    assert f"requeueing job {job}" in text and "a stop signal cut its final evaluation short" in text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        starts, evals = f["starts"][:], f["eval"][:]
    assert starts["restart"].tolist() == [0, 1]
    assert len(evals) == 1 and evals["episodes"][0] == 10000  # the resume's, complete


def test_a_warning_while_the_ranks_start_checkpoints_requeues_and_completes(slurm_cluster, tmp_path):
    """Slurm's warning while the step's ranks are still starting, before `ddrl train` takes
    USR1 as a stop request (here: each rank 8 s slow to start, as from a slow shared
    filesystem). It killed them, and the job failed instead of requeueing; now a starting
    rank ignores it and the batch script repeats it until the step ends."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    slow = venv / "bin" / "ddrl"
    slow.write_text(f'#!/bin/sh\n[ "$1" != train ] || sleep 8\nexec {REPO}/.venv/bin/ddrl "$@"\n')
    slow.chmod(0o755)
    out = tmp_path / "run"
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_frames=120000", *FAST,
                               env={"DDRL_VENV": str(venv)})
    deadline = time.monotonic() + 120
    output = slurm_cluster.root / "out" / f"{job}.out"
    while not (output.is_file() and f"ddrl: job {job} restart 0 on" in output.read_text()):
        assert time.monotonic() < deadline, slurm_cluster.records(job)
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    [result] = slurm_cluster.wait(job, timeout=300)
    text = result.text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text
    assert f"requeueing job {job}" in text and "the step failed" not in text, text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        assert f["starts"]["restart"].tolist()[:2] == [0, 1]


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_cancel_checkpoints_and_the_job_stays_cancelled(slurm_cluster, tmp_path, launcher):
    """scancel: the ranks checkpoint and the batch script says so before Slurm kills what is
    left of the job (KillWait, 10 s here). Here every rank's process outlives `ddrl train`,
    deaf to TERM, as a rank does whose end is slow (a stop ignores further signals) or whose
    output a stray process holds: the script waited for the launcher and was killed first.
    mpirun, given Slurm's TERM too, ended with its own code, and the script said nothing."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    slow = venv / "bin" / "ddrl"
    slow.write_text(f'#!/bin/bash\n[ "$1" = train ] || exec {REPO}/.venv/bin/ddrl "$@"\n'
                    f'trap "" TERM\n{REPO}/.venv/bin/ddrl "$@"\nrc=$?\nsleep 60\nexit $rc\n')
    slow.chmod(0o755)
    out = tmp_path / "run"
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_frames=10_000_000", *FAST,
                               env={"DDRL_VENV": str(venv), "DDRL_LAUNCHER": launcher})
    wait_for_training(slurm_cluster, job, out / "log.h5", timeout=90)
    slurm_cluster.run("scancel", job)
    [result] = slurm_cluster.wait(job, timeout=180)
    # Slurm marks the job cancelled at once; its batch script finishes within KillWait.
    deadline = time.monotonic() + 60
    while "ddrl: cancelled" not in result.text() and time.monotonic() < deadline:
        time.sleep(0.5)
    text = result.text()
    assert "ddrl: cancelled: checkpointed, not requeued" in text, text
    assert "requeued\n" not in text.replace("not requeued", "")
    record = slurm_cluster.records(job)[0]
    assert (record["JobState"], record["Restarts"]) == ("CANCELLED", "0"), record
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).update >= 1


@pytest.mark.parametrize("fault,sig,sets,line", [
    ("killed", signal.SIGKILL, (), "task 1: Killed"),
    # A frozen rank (a hung node): rank 0's all-reduce watchdog ends the step (exit 4; the
    # step's code is the frozen task's once srun has killed it within KillWait).
    ("frozen", signal.SIGSTOP, ("--set", "sync.timeout=15"),
     "ddrl: error: rank 0 waited 15 s (sync.timeout) in all-reduce"),
], ids=["killed", "frozen"])
def test_a_lost_rank_restarts_the_step_from_its_checkpoint(slurm_cluster, tmp_path, fault,
                                                           sig, sets, line):
    out = tmp_path / "run"
    # The run ends on its training time (counted across restarts), whatever the CPU's speed:
    # the job's frame budget, out of reach (a fast CPU made CartPole's 400,000 within 20 s).
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_minutes=0.25", "--set", "run.max_frames=100000000",
                               "--set", "run.checkpoint_minutes=0.1", *sets, *FAST)
    deadline = time.monotonic() + 120
    while checkpoint.latest(out / "checkpoints") is None:
        assert time.monotonic() < deadline and slurm_cluster.state(job) in ("PENDING", "RUNNING")
        time.sleep(0.5)
    os.kill(rank_pid(out, 1, wait=10, rank_var="SLURM_PROCID"), sig)
    lost_at = time.monotonic()
    resumed = checkpoint.load(checkpoint.latest(out / "checkpoints"))
    [result] = slurm_cluster.wait(job, timeout=300)
    text = result.text()
    assert (result.state, result.exit_code, result.restarts) == ("COMPLETED", 0, 0), text
    assert line in text and "restart 1 of 3 from the last checkpoint" in text, text
    with h5py.File(out / "log.h5", "r", swmr=True) as f:
        starts = f["starts"][:]
        rows = f["train"][:]
        assert f.attrs["restarts"] == 1
    assert list(starts["restart"]) == [0, 1] and list(starts["world_size"]) == [2, 2], starts
    # The restart went on from a checkpoint at least as recent as the one seen before the kill.
    assert starts["update"][1] >= resumed.update > 0, (starts, resumed.update)
    assert np.all(np.diff(rows["update"]) > 0)
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).wall_time >= 15
    print(f"{fault} rank: restarted from update {starts['update'][1]}; job done "
          f"{time.monotonic() - lost_at:.0f} s after the fault")


def test_a_launcher_that_outlives_rank_0_is_ended_after_the_grace(slurm_cluster, tmp_path):
    """A process outside the step's process tree (a daemon a rank started, say) holds rank 1's
    output open, so srun waits on it after every rank exited. The batch script ends srun
    DDRL_STEP_GRACE seconds after rank 0 exited and exits with rank 0's code, long before that
    process ends; the job completes once it is gone."""
    out = tmp_path / "run"
    job = slurm_cluster.submit(SLURM / "train.sbatch", str(CARTPOLE), "--out", str(out),
                               "--set", "run.max_frames=30000", *FAST,
                               env={"DDRL_STEP_GRACE": "5"})
    rank1 = rank_pid(out, 1, wait=120, rank_var="SLURM_PROCID")
    with open(f"/proc/{rank1}/fd/1", "wb") as output:  # the pipe to slurmstepd
        holder = subprocess.Popen(["sleep", "600"], stdout=output, start_new_session=True)
    try:
        # The batch script has exited once the job is COMPLETING: slurmd then waits on the
        # step's output, which only the holder's end closes (or, much later, Slurm's timeouts).
        slurm_cluster.wait(job, timeout=240, states=FINAL_STATES | {"COMPLETING"})
        assert holder.poll() is None, "the batch script should end while the holder still runs"
    finally:
        holder.kill()
        holder.wait()
    [result] = slurm_cluster.wait(job, timeout=120)
    text = result.text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text
    assert "ddrl: error: rank 0 exited (code 0) 5 s ago but the step's launcher is still there" \
        in text, text
    assert "ddrl: the step failed" not in text, text
    assert checkpoint.load(checkpoint.latest(out / "checkpoints")).frames >= 30000


def test_printed_array_script_runs_two_seeds(slurm_cluster, tmp_path):
    script = ddrl_slurm(str(CARTPOLE), "--array", "0-1", "--tasks-per-node", "1",
                        "--set", "run.max_frames=8000", *FAST)
    assert script.returncode == 0, script.stderr
    # The array also covers the mpirun launcher. Unbound: with task/none each task's mpirun
    # would pin its rank to core 0.
    job = slurm_cluster.submit(None, options=(f"--chdir={tmp_path}",), stdin=script.stdout,
                               env={"DDRL_LAUNCHER": "mpirun", "DDRL_MPIRUN_ARGS": "--bind-to none"})
    results = slurm_cluster.wait(job, timeout=150)
    assert [(r.state, r.exit_code) for r in results] == [("COMPLETED", 0)] * 2, \
        [r.text() for r in results]
    seeds = []
    for task in (0, 1):
        run_dir = tmp_path / "runs" / f"cartpole-{job}_{task}"
        assert (run_dir / "log.h5").is_file() and checkpoint.latest(run_dir / "checkpoints")
        seeds.append(next(line for line in (run_dir / "config.toml").read_text().splitlines()
                          if line.startswith("seed =")))
    assert seeds == ["seed = 0", "seed = 1"]


def test_bad_job_file_fails_fast_in_one_line(slurm_cluster, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CARTPOLE.read_text() + "\n[debug]\nslow_rank = [1]\n")
    started = time.monotonic()
    # Job file and run directory given the other way, through the environment.
    job = slurm_cluster.submit(SLURM / "train.sbatch",
                               env={"DDRL_JOB": str(bad), "DDRL_OUT": str(tmp_path / "run")})
    [result] = slurm_cluster.wait(job, timeout=60)
    text = result.text()
    assert (result.state, result.exit_code) == ("FAILED", 2), text
    errors = [line for line in text.splitlines() if line.startswith("ddrl: error:")]
    assert len(errors) == 1 and "unknown config key 'debug.slow_rank'" in errors[0], text
    assert "Traceback" not in text and "srun" not in text, text
    assert time.monotonic() - started < 30


def test_a_job_path_with_a_newline_stays_inside_the_header_comment(tmp_path):
    odd = tmp_path / "weird\nrm -rf ~"
    odd.mkdir()
    job = odd / "cartpole.toml"
    job.write_text(CARTPOLE.read_text())
    proc = ddrl_slurm(str(job))
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.split("\n#SBATCH")[0].splitlines()
    assert header[0] == "#!/bin/bash" and all(line.startswith("#") for line in header)
    assert subprocess.run(["bash", "-n"], input=proc.stdout, text=True).returncode == 0


def test_a_central_job_prints_a_heterogeneous_script():
    """Learner block first (the job's options, --learner-*), actors' sizes after `hetjob`."""
    proc = ddrl_slurm(str(CARTPOLE), "--set", "sync.mode=central", "--nodes", "4",
                      "--cpus-per-task", "8", "--learner-cpus", "16", "--learner-gpus", "1",
                      "--time", "02:00:00")
    assert proc.returncode == 0, proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH")]
    split = header.index("#SBATCH hetjob")
    learner, actors = header[:split], header[split + 1:]
    assert {"#SBATCH --cpus-per-task=16", "#SBATCH --gres=gpu:1", "#SBATCH --time=02:00:00",
            "#SBATCH --nodes=1", "#SBATCH --signal=B:USR1@120"} <= set(learner), learner
    assert {"#SBATCH --nodes=4", "#SBATCH --cpus-per-task=8"} <= set(actors), actors
    assert not any("--time" in line or "--gres" in line for line in actors)
    assert subprocess.run(["bash", "-n"], input=proc.stdout, text=True).returncode == 0
    refused = ddrl_slurm(str(CARTPOLE), "--learner-cpus", "4")
    assert refused.returncode == 2 and "for sync.mode = 'central'" in refused.stderr
