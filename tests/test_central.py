"""Central inference (SEED RL) end to end: real mpirun, real simulators on actor ranks that
never load TensorFlow, the learner batching their observations; across simulated hosts; a
frozen actor left out; a stop signal and a resume."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    DDRL,
    JOBS,
    NO_EVAL,
    RAINBOW,
    ROOT,
    assert_solved,
    ddrl,
    env_for_tests,
    mpirun,
    rank_pid,
    run_with_a_frozen_rank,
    table,
    wait_for_updates,
)

from ddrl.bench import simhosts
from ddrl.loop.trainer import EXIT_SIGNALLED
from ddrl.rundir import checkpoint

CENTRAL = ("--set", "sync.mode=central", "--set", "algo.name=vtrace")


def actor_lines(out: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in
            re.finditer(r"\[ddrl\] actor rank (\d+): .*", out)}


def check_actors(run_dir, out: str, actors: list[int]) -> None:
    lines = actor_lines(out)
    assert sorted(lines) == actors, out[-3000:]
    assert all(line.endswith("tensorflow loaded: no") for line in lines.values()), lines
    ranks = table(run_dir, "ranks")
    for r in actors:
        rows = ranks[ranks["rank"] == r]
        # Summed: on a loaded machine an interval can pass without a step from one actor.
        assert len(rows) and rows["frames"].sum() > 0 and rows["bytes_in"].sum() > 0
        assert rows["bytes_out"].sum() > 0 and (rows["t_wait"] >= 0).all()
    learner = ranks[ranks["rank"] == 0]
    assert len(learner) and (learner["bytes_in"] == 0).all()


@pytest.mark.skipif(simhosts.available() is not None, reason=str(simhosts.available()))
def test_central_learns_cartpole_with_actors_on_other_hosts(run_dir):
    """The learner on one host, an actor rank on each of two others: CartPole's target."""
    with simhosts.SimulatedHosts(3) as net:
        cmd = net.mpirun([1, 1, 1]) + DDRL + ["train", str(JOBS / "cartpole.toml"), "--out",
                                              str(run_dir), *CENTRAL,
                                              "--set", "run.max_frames=300000"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env=env_for_tests())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "sync central" in res.stdout and "stopped (target)" in res.stdout
    assert_solved(run_dir, "central vtrace")
    check_actors(run_dir, res.stdout, [1, 2])
    train = table(run_dir, "train")
    assert np.isfinite(train["approx_kl"]).all() and (train["policy_lag"] >= 0).all()


@pytest.mark.skipif(simhosts.available() is not None, reason=str(simhosts.available()))
@pytest.mark.parametrize("fault", ["actor frozen", "actor's link cut", "actor killed",
                                   "learner frozen", "learner's link cut"])
def test_a_fault_on_another_host_ends_or_carries_on_as_documented(run_dir, tmp_path, fault):
    """The learner on h1, an actor on each of h2 and h3, every link at 5 Mbit/s. An actor
    frozen on its host, or cut off (its link down: no reset, packets dropped), is left out
    after sync.timeout and the run trains on to its end and saves; an actor killed ends the
    job at once, its last checkpoint kept; a frozen learner is found gone by the actors,
    which end the job; a learner cut off is ended by its host's daemon, its last checkpoint
    kept, and the actors find it gone. Each within a bounded time. After a cut, mpirun
    itself waits for the lost host's daemon until TCP gives up (docs/reliability.md): the
    test ends it once every rank has ended."""
    # Long enough that the kill comes well before the end.
    frames = 300000 if fault == "actor killed" else 60000
    sets = ["--set", f"run.max_frames={frames}", "--set", "sync.timeout=4",
            "--set", "run.checkpoint_minutes=0.05"]
    if "frozen" in fault:
        rank = 2 if fault == "actor frozen" else 0
        sets += ["--set", f"debug.freeze_rank={rank}", "--set", "debug.freeze_update=50"]
    output = tmp_path / "out.txt"
    with simhosts.SimulatedHosts(3, rate="5mbit") as net, output.open("w") as sink:
        cmd = net.mpirun([1, 1, 1]) + DDRL + ["train", str(JOBS / "cartpole.toml"), "--out",
                                              str(run_dir), *CENTRAL, *NO_EVAL, *sets]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env_for_tests(), stdout=sink,
                                stderr=subprocess.STDOUT, text=True)
        try:
            if fault in ("actor killed", "actor's link cut", "learner's link cut"):
                wait_for_updates(proc, run_dir, 50)
                while checkpoint.latest(run_dir / "checkpoints") is None:
                    assert proc.poll() is None and time.monotonic() - started < 120
                    time.sleep(0.2)
                ranks = [rank_pid(run_dir, r) for r in range(3)]
                if fault == "actor killed":
                    os.kill(ranks[2], signal.SIGKILL)
                else:
                    host = net.hosts[2 if fault == "actor's link cut" else 0]
                    subprocess.run(["ip", "link", "set", host.link, "down"], check=True)
                    # Every rank ends; mpirun then waits for the cut host's daemon.
                    while any(Path(f"/proc/{pid}").exists() for pid in ranks) and \
                            time.monotonic() - started < 200:
                        time.sleep(0.5)
                    proc.kill()
            proc.wait(timeout=240)
        finally:
            proc.kill()
    took, out = time.monotonic() - started, output.read_text()
    assert proc.returncode != 0 and took < 200, (took, out[-3000:])
    if fault in ("actor frozen", "actor's link cut"):
        # A cut link can stop the actor between a step's head and its observations too.
        assert re.search(r"actor rank 2 (sent nothing|stopped between a step's head and its "
                         r"observations) for 4 s \(sync\.timeout\); going on with 1 actor", out), out
        assert "stopped (frames)" in out and "the run is saved" in out, out[-3000:]
        assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).frames >= frames
    else:
        if fault == "learner frozen":
            assert "(2 x sync.timeout + 10 s): the learner is gone" in out, out[-3000:]
        assert 0 < checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).frames < frames


def test_central_recurrent_vtrace_keeps_each_remote_simulators_state_on_the_learner(run_dir):
    """SEED's shape with an LSTM: the actors only simulate; the learner carries each remote
    simulator's recurrent state, cuts sequences of acting.t_max steps and learns on them."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL,
               "--set", "algo.recurrent=16", "--set", "acting.t_max=16", "--set",
               "acting.batch_size=64", "--set", "run.max_frames=150000", "--set", "eval.every=50",
               "--set", "eval.target=60", ranks=3, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_actors(run_dir, res.stdout, [1, 2])
    # 4 sequences a batch; the greedy policy far above random play (about 22): the run stops
    # at the first evaluation that shows it.
    assert (table(run_dir, "train")["effective_batch"] == 4).all()
    assert "stopped (target)" in res.stdout, res.stdout[-3000:]
    assert table(run_dir, "eval")["mean_return"].max() >= 60


def test_central_rainbow_saves_its_replay_memory_and_resumes_with_it(run_dir):
    """SEED's value-based shape: the replay memory (prioritized, one stream per remote
    simulator) and the epsilon-greedy acting on the learner, saved with its priorities and
    taken up again. Rainbow's learning: tests/test_dqn.py."""
    sets = ("--set", "sync.mode=central", "--set", "dqn.save_replay=true", *NO_EVAL,
            *(a for m in RAINBOW for a in ("--set", m)))
    first = ddrl("train", JOBS / "cartpole-dqn.toml", "--out", run_dir, *sets,
                 "--set", "run.max_frames=4000", ranks=3, timeout=240)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # 2 actor ranks x central.groups 2 x acting.n_sim 10.
    assert "replay memory: 50,000 frames in 40 stream(s)" in first.stdout
    saved = checkpoint.read_arrays(run_dir / "checkpoints" / "replay-rank0.npz")
    assert saved["acted"].shape[0] == 40 and saved["acted"].sum() > 2000
    # Trained-on transitions carry their own priorities, not all the same one.
    assert len(np.unique(saved["priorities"][saved["priorities"] > 0])) > 100
    again = ddrl("train", run_dir / "config.toml", "--out", run_dir, "--resume", *sets,
                 "--set", "run.max_frames=6000", ranks=3, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[ddrl] replay memory restored" in again.stdout and "not restored" not in again.stderr
    check_actors(run_dir, again.stdout, [1, 2])


@pytest.mark.parametrize("mid_step, why", [
    (False, "sent nothing"),
    # Its head received, its observations never come: the learner's receive had no deadline
    # and inference stopped for every actor.
    (True, "stopped between a step's head and its observations")])
def test_a_frozen_actor_is_left_out_and_the_run_goes_on(run_dir, mid_step, why):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, *NO_EVAL,
               "--set", "run.max_frames=80000", "--set", "sync.timeout=4",
               "--set", "debug.freeze_rank=2", "--set", "debug.freeze_update=50",
               "--set", f"debug.freeze_mid_step={str(mid_step).lower()}", ranks=3, timeout=240)
    out = res.stdout + res.stderr
    assert f"actor rank 2 {why} for 4 s (sync.timeout); going on with 1 actor rank(s)" in out, \
        out[-3000:]
    assert "stopped (frames)" in out, out[-3000:]
    # Saved, then the job ends: only an abort also ends the frozen rank.
    assert res.returncode != 0
    assert "actor rank(s) 2 sent nothing for sync.timeout and were left out; the run is saved" in out
    train = table(run_dir, "train")
    assert train["frames"][-1] >= 80000 - 1000
    # The rows of the last logged update: rank 1 still, rank 2 no longer.
    ranks = table(run_dir, "ranks")
    last = ranks[ranks["update"] == ranks["update"].max()]["rank"].tolist()
    assert 1 in last and 2 not in last, last


def test_an_actor_that_wakes_up_after_it_was_left_out_stops_and_the_learner_trains_on(run_dir):
    """Left out after sync.timeout, then awake again: told it is out, it stops instead of
    waiting for actions that never come and then ending the job as if the learner were gone
    (which cost the learner its final checkpoint)."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, *NO_EVAL,
               "--set", "run.max_frames=150000", "--set", "sync.timeout=3",
               "--set", "debug.freeze_rank=2", "--set", "debug.freeze_update=50",
               "--set", "debug.freeze_seconds=8", ranks=3, timeout=300)
    out = res.stdout + res.stderr
    assert "actor rank 2 sent nothing for 3 s (sync.timeout); going on with 1 actor rank(s)" in out
    assert "actor rank 2: the learner left it out" in out, out[-3000:]
    assert "the learner is gone" not in out and "stopped (frames)" in out, out[-3000:]
    assert checkpoint.load(checkpoint.latest(run_dir / "checkpoints")).frames >= 150000


def test_an_actor_frozen_before_the_split_ends_the_job_in_one_line(run_dir):
    """Frozen before central mode's split of the world (a hung import from a shared
    filesystem): the learner and the other actor waited in the split for ever, spinning; the
    start-up's deadline ends the job instead."""
    cmd = [*mpirun(3), *DDRL, "train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL,
           *NO_EVAL, "--set", "sync.timeout=5", "--set", "sync.startup_timeout=20",
           "--set", "debug.freeze_rank=2", "--set", "debug.freeze_update=-3"]
    code, out = run_with_a_frozen_rank(cmd, run_dir, 2)
    assert code != 0
    assert re.search(r"ddrl: error: rank \d waited 20 s \(sync.timeout, at least "
                     r"sync.startup_timeout = 20 s at start-up\) in a start-up collective for "
                     r"rank 2, which never joined", out), out[-3000:]


@pytest.mark.parametrize("seconds", [20, 0])
def test_a_slow_learner_start_up_is_waited_for_and_a_frozen_one_ends_the_job(run_dir, seconds):
    """The learner's start-up held 20 s (a replay restored from a slow shared filesystem),
    past the actors' 16 s deadline (2 x sync.timeout + 10): its heartbeats keep them, and the
    run ends well; it aborted as "the learner is gone" before. Frozen whole (SIGSTOP), it
    beats no more and the actors end the job within the deadline."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, *NO_EVAL,
               "--set", "run.max_frames=6000", "--set", "sync.timeout=3",
               "--set", "debug.freeze_rank=0", "--set", "debug.freeze_update=-1",
               "--set", f"debug.freeze_seconds={seconds}", ranks=3, timeout=240)
    out = res.stdout + res.stderr
    if seconds:
        assert res.returncode == 0 and "stopped (frames)" in out, out[-3000:]
        assert "the learner is gone" not in out
    else:
        assert res.returncode != 0 and "(2 x sync.timeout + 10 s): the learner is gone" in out, \
            out[-3000:]


def test_an_actor_frozen_shortly_before_the_end_ends_the_job_once_the_learner_saved(run_dir):
    """Frozen a few seconds before the run's last frames, too late to be left out during the
    run: its goodbye never comes, and after sync.timeout the learner counts it lost and ends
    the job, saved, rather than waiting for it at the final barrier for ever. The final
    checkpoint is written before that wait: Slurm's warning gives 120 s, sync.timeout may be
    more."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, *NO_EVAL,
               "--set", "run.max_frames=6000", "--set", "sync.timeout=30",
               "--set", "debug.freeze_rank=2", "--set", "debug.freeze_update=50",
               ranks=3, timeout=240)
    ended = time.time()
    out = res.stdout + res.stderr
    assert "stopped (frames)" in out and "going on with" not in out, out[-3000:]
    assert res.returncode != 0
    assert "actor rank(s) 2 sent nothing for sync.timeout and were left out; the run is saved" in out
    final = checkpoint.latest(run_dir / "checkpoints")
    assert checkpoint.load(final).frames >= 6000
    assert ended - final.stat().st_mtime > 20, "the final checkpoint waited for the goodbyes"


@pytest.mark.parametrize("case, expected", [
    ("good", "received [0, 1, 2, 3] [0.0, 1.0, 2.0"),
    ("bad-id", "ddrl: error: central: actor rank 1 sent a malformed step (simulator ids "
               "[0, 1, 2, 7] of a group of 4)"),
    ("short", "ddrl: error: central: actor rank 1 sent 56 bytes of observations where its "
              "step's head announces 64")])
def test_the_learner_checks_an_actors_step_before_it_writes_a_frame(case, expected):
    """An id past the group's simulators would write into another simulator's frames, a
    short message would leave bytes uninitialised: both are named, with the rank."""
    res = subprocess.run([*mpirun(2), sys.executable, str(ROOT / "tests" / "central_messages.py"),
                          case], cwd=ROOT, env=env_for_tests(), capture_output=True, text=True,
                         timeout=120)
    assert expected in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def test_a_stop_signal_checkpoints_and_the_run_resumes(run_dir):
    cmd = mpirun(3) + DDRL + ["train", str(JOBS / "cartpole.toml"), "--out", str(run_dir),
                              *CENTRAL, *NO_EVAL, "--set", "run.max_frames=60000",
                              "--set", "run.log_every=5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=env_for_tests())
    try:
        wait_for_updates(proc, run_dir, 20)
        time.sleep(1)
        proc.send_signal(signal.SIGUSR1)  # mpirun forwards it to every rank, as Slurm's warning
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_SIGNALLED, out[-3000:]
    assert "stopped (signal)" in out and len(actor_lines(out)) == 2, out[-3000:]
    stopped_at = table(run_dir, "train")["update"][-1]
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--resume", *CENTRAL, *NO_EVAL,
               "--set", "run.max_frames=60000", "--set", "run.log_every=5", ranks=3, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    train = table(run_dir, "train")
    assert np.all(np.diff(train["update"]) > 0) and train["update"][-1] > stopped_at
    assert table(run_dir, "starts")["restart"].tolist() == [0, 1]
    check_actors(run_dir, res.stdout, [1, 2])


@pytest.mark.parametrize("override, message", [
    (("--set", "acting.mode=a2c"), "sync.mode = 'central': the learner runs the ba3c node"),
    (("--set", "sync.backend=none"), "sync.mode = 'central' sends with mpi4py point to point"),
])
def test_central_refuses_what_cannot_work(override, message, run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, *override, ranks=2,
               timeout=120)
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]


def test_central_needs_an_actor_rank(run_dir):
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, *CENTRAL, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == ("ddrl: error: sync.mode = 'central' needs a learner and at "
                                  "least one actor rank, got 1 rank(s)")


@pytest.mark.skipif(simhosts.available() is not None, reason=str(simhosts.available()))
def test_bench_central_prints_both_modes():
    res = ddrl("bench", "central", JOBS / "cartpole.toml", "--hosts", "2", "--rates", "1gbit",
               "--seconds", "3", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] == ["1gbit"]]
    assert [r[2] for r in rows] == ["central", "per-rank"], res.stdout
    central = rows[0]
    assert float(central[3].replace(",", "")) > 0 and float(central[4]) > 0, central
    assert 1 <= float(central[5]) <= 16, central  # observations per inference batch
