"""The evaluator process at the edges of a run (real `ddrl train`, real processes): killed, it
is replaced and the run goes on; rank 0 killed, it ends itself; a terminal's Ctrl-C stops the
run through rank 0 alone. And the benchmarks of its cost and of time to score."""
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
from conftest import DDRL, JOBS, ROOT, ddrl, env_for_tests, rank_pid, table

from ddrl.distributed.launch import mpirun_command
from ddrl.loop.evaluator import MAX_SIBLINGS

# Frequent evaluations on CartPole (at niceness 0, as its job files have it).
EVALS = ["--set", "eval.every=20", "--set", "eval.target=none"]


def start(run_dir: Path, *sets: str) -> subprocess.Popen:
    """`ddrl train` in a process group of its own, with a terminal's SIGINT: a test run in the
    background of a shell inherits SIGINT ignored."""
    return subprocess.Popen([*DDRL, "train", str(JOBS / "cartpole.toml"), "--out", str(run_dir),
                             *EVALS, *sets], cwd=ROOT, env=env_for_tests(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def worker_of(proc: subprocess.Popen, timeout: float = 90, other_than: int = 0,
              rank0: int = 0) -> int:
    """The pid of the run's evaluator process, once it has one (not `other_than`); `rank0`:
    the pid of rank 0 where `proc` is its launcher. A run that ends or outlasts `timeout` first
    fails the test with what it printed, and, when it still runs, where its threads are
    (py-spy)."""
    deadline = time.monotonic() + timeout
    rank0 = rank0 or proc.pid
    while time.monotonic() < deadline and proc.poll() is None:
        children = Path(f"/proc/{rank0}/task/{rank0}/children").read_text().split()
        for child in (c for c in map(int, children) if c != other_than):
            try:
                if b"ddrl.loop.eval_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except FileNotFoundError:
                continue
        time.sleep(0.2)
    stacks = "" if proc.poll() is not None else subprocess.run(
        [str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(proc.pid)],
        capture_output=True, text=True, timeout=60).stdout
    proc.kill()
    out, err = proc.communicate(timeout=30)
    raise AssertionError(f"no evaluator process under {proc.pid} within {timeout} s (exit "
                         f"status {proc.returncode}):\n{stacks}\n{out}\n{err}")


def gone(pid: int, timeout: float = 30) -> bool:
    """The process ended (a zombie waiting for its new parent counts as ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


def evaluator(share: float):
    from ddrl.config import load_config
    from ddrl.envs import env_spec
    from ddrl.loop.evaluator import BackgroundEvaluator

    cfg = load_config(JOBS / "cartpole.toml", [f"eval.cpu_share={share}", "eval.episodes=4"])
    spec = env_spec(cfg)
    return cfg, spec, BackgroundEvaluator(cfg, spec, cores=1, deterministic=True)


@pytest.mark.parametrize("share", [1e-6, 1.0])
def test_the_evaluator_process_plays_reports_its_cpu_and_keeps_its_share(share):
    from ddrl.learner import Learner
    from ddrl.loop.evaluator import Snapshot

    cfg, spec, ev = evaluator(share)
    try:
        assert ev.within_budget()  # the first evaluation: nothing spent, nothing known
        ev.start(Snapshot(Learner(cfg, *spec).get_weights(), update=7, frames=700, wall_time=1.5))
        assert ev.busy
        done = ev.poll(wait=True)
        assert (done.update, done.frames, done.wall_time, done.result.episodes) == (7, 700, 1.5, 4)
        assert 0 < done.cpu_seconds < done.seconds * os.cpu_count()
        assert not ev.busy and ev.poll() is None
        # One evaluation spent: a tiny share now holds the next back, no limit does not.
        assert ev.within_budget() == (share == 1.0)
    finally:
        ev.cancel()


def test_a_failed_evaluation_is_one_error_line():
    from ddrl.errors import DdrlError
    from ddrl.loop.evaluator import Snapshot

    _, _, ev = evaluator(1.0)
    try:
        ev.start(Snapshot(np.zeros(3, np.float32), update=3, frames=30, wall_time=0.1))
        with pytest.raises(DdrlError, match=r"^the evaluation of update 3 failed: \w+Error: "):
            ev.poll(wait=True)
    finally:
        ev.cancel()


def test_a_killed_evaluator_is_replaced_and_the_run_goes_on(run_dir):
    proc = start(run_dir, "--set", "run.max_minutes=0.6", "--set", "run.max_frames=100000000")
    try:
        first = worker_of(proc)
        os.kill(first, signal.SIGKILL)
        second = worker_of(proc, other_than=first)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert re.search(r"warning: the evaluator process died \(signal 9\); the evaluation of update "
                     r"\d+ is lost, a new process plays the next", err), err
    assert "Traceback" not in err, err
    evals = table(run_dir, "eval")
    # Evaluations went on after the loss, by the new process (its CPU time on each row).
    assert (evals["cpu_seconds"] > 0).sum() >= 2, evals
    assert gone(second)


def niceness(pid: int) -> set[int]:
    """The niceness of each of the process's threads (Linux's is per thread)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.add(int(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[16]))
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return found


def test_rank0_killed_takes_its_evaluator_with_it(run_dir):
    """At eval.nice 19 once started: all its threads, TensorFlow's pools included."""
    proc = start(run_dir, "--set", "run.max_frames=100000000", "--set", "eval.nice=19")
    try:
        worker = worker_of(proc)
        deadline = time.monotonic() + 90
        while niceness(worker) != {19} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert niceness(worker) == {19}
        assert niceness(proc.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}
        proc.kill()
        proc.wait(timeout=30)
        # Its pipe from rank 0 closed: the evaluator abandons its game and exits.
        assert gone(worker), "the evaluator outlived rank 0"
    finally:
        proc.kill()


def test_the_evaluator_may_use_the_cores_of_every_rank_on_its_machine(run_dir):
    """Ranks bound to cores as ddrl starts them (`make run`, sweeps, benchmarks; one core each
    on a 2-core machine): rank 0's evaluator is not held to rank 0's core, it may take the time
    any rank of the job leaves idle, and no core beyond theirs. A frames budget, not a time
    one: on loaded cores the evaluations fall due all the same."""
    proc = subprocess.Popen([*mpirun_command(2), *DDRL, "train", str(JOBS / "cartpole.toml"),
                             "--out", str(run_dir), *EVALS, "--set", "run.max_minutes=5",
                             "--set", "run.max_frames=15000"],
                            cwd=ROOT, env=env_for_tests(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ranks = [rank_pid(run_dir, r, wait=60) for r in (0, 1)]
        # Generous: two ranks importing TensorFlow on loaded cores reach update 20 slowly.
        worker = worker_of(proc, timeout=300, rank0=ranks[0])
        cpus = [os.sched_getaffinity(pid) for pid in ranks]
        # The worker widens its own affinity as its main starts, a moment after the launcher
        # names it: poll until then.
        deadline = time.monotonic() + 60
        while (own := os.sched_getaffinity(worker)) != cpus[0] | cpus[1] \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert own == cpus[0] | cpus[1], (cpus, own, worker)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 3), (signal.SIGINT, 130)])
def test_a_signal_to_the_process_group_stops_the_run_once_and_quietly(run_dir, sig, code):
    """scancel's SIGTERM and a terminal's Ctrl-C reach the whole process group, evaluator
    included: rank 0 alone acts on them (SIGTERM: a checkpoint and exit 3, resumable; SIGINT:
    `ddrl: interrupted`), the evaluator ends with it, and no process prints a traceback."""
    proc = start(run_dir, "--set", "run.max_frames=100000000")
    try:
        worker = worker_of(proc)
        time.sleep(1.0)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert gone(worker)
    if sig == signal.SIGTERM:
        assert list((run_dir / "checkpoints").glob("ckpt-*.npz"))


def test_bench_eval_measures_the_evaluator_from_a_trained_run(tmp_path):
    trained = tmp_path / "trained"
    res = ddrl("train", JOBS / "cartpole.toml", "--out", trained, "--set", "run.max_frames=4000",
               "--set", "eval.target=none", timeout=180)
    assert res.returncode == 0, res.stderr
    before = len(table(trained, "train")), sorted((trained / "checkpoints").iterdir())
    res = ddrl("bench", "eval", JOBS / "cartpole.toml", "--from", trained, "--seconds", "8",
               "--pairs", "1", "--set", "eval.every=20", timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"^off #1\s+[\d,]+$", out, re.M), out
    on = re.search(r"^on #1\s+[\d,]+\s+(\d+)\s+\d+\.\d\s+\d+\.\d\d\s+\d+\.\d%$", out, re.M)
    assert on and int(on.group(1)) >= 1, out
    assert re.search(r"evaluation on / off: \d\.\d{3} of the frames/s \(pairs: \d\.\d{3}\); "
                     r"the evaluator costs -?\d+\.\d%", out), out
    # The trained run itself is untouched: the windows ran on a copy.
    assert (len(table(trained, "train")), sorted((trained / "checkpoints").iterdir())) == before
    res = ddrl("bench", "eval", JOBS / "cartpole.toml", "--from", tmp_path / "none", timeout=60)
    assert res.returncode == 2 and "ddrl: error: --from" in res.stderr, res.stderr


def test_bench_paused_eval_times_each_layout_on_a_runs_best_weights(tmp_path):
    trained = tmp_path / "trained"
    res = ddrl("train", JOBS / "cartpole.toml", "--out", trained, "--set", "run.max_frames=2000",
               "--set", "eval.target=none", "--set", "eval.every=10", timeout=180)
    assert res.returncode == 0, res.stderr
    res = ddrl("bench", "paused-eval", trained, "--episodes", "4", "--sims", "0", "2",
               "--rounds", "1", "--cores", "2", timeout=180)
    assert res.returncode == 0, res.stderr
    # CartPole's simulators step in one batch, halves or not: 4 (the evaluator's own) and 2,
    # each on new simulators and on kept ones.
    rows = re.findall(r"^\s+4\s+(\d+)\s+(\d+)\s+(new|kept)\s+\d+\.\d\d\s+(-?\d+\.\d\d)\s+"
                      r"[\d,]+$", res.stdout, re.M)
    assert [row[:3] for row in rows] == [(s, s, made) for s in "42" for _ in "ab"
                                         for made in ("new", "kept")], res.stdout
    # The same games on kept simulators as on new ones.
    assert rows[0][3] == rows[1][3], res.stdout
    assert re.search(r"^4 games, median seconds \(ratio to 4 simulators in one batch, new\): 4 "
                     r"sims one batch new [\d.]+ \(1\.00\), 4 sims one batch kept", res.stdout,
                     re.M), res.stdout
    res = ddrl("bench", "paused-eval", trained, "--weights", "nothing.npz", timeout=60)
    assert res.returncode == 2 and "ddrl: error: --weights nothing.npz" in res.stderr, res.stderr
    res = ddrl("bench", "paused-eval", tmp_path / "none", timeout=60)
    assert res.returncode == 2 and "ddrl: error: " in res.stderr and "best.npz" in res.stderr, \
        res.stderr


def test_bench_policies_plays_random_and_each_held_action_under_the_eval_protocol():
    res = ddrl("bench", "policies", JOBS / "pong-ppo.toml", "--episodes", "1", timeout=120)
    assert res.returncode == 0, res.stderr
    rows = dict(re.findall(r"^(random|hold \w+)\s+(-?\d+\.\d)\s", res.stdout, re.M))
    held = ("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE")
    assert list(rows) == ["random", *(f"hold {a}" for a in held)], res.stdout
    # A paddle that never moves, or stays at one wall, returns no serve: 0-21.
    assert all(float(rows[f"hold {a}"]) == -21.0 for a in held), res.stdout
    assert -21.0 <= float(rows["random"]) <= -15.0, res.stdout
    res = ddrl("bench", "policies", JOBS / "pong-ppo.toml", "--episodes", "0", timeout=60)
    assert res.returncode == 2 and "ddrl: error: --episodes 0" in res.stderr, res.stderr


def test_bench_target_runs_each_seed_to_the_target_and_resumes(tmp_path):
    out = tmp_path / "tts"
    args = ("bench", "target", JOBS / "cartpole.toml", "--out", out, "--seeds", "2",
            "--ranks", "1", "--set", "eval.target=30", "--set", "eval.every=10",
            "--set", "run.max_frames=100000")
    res = ddrl(*args, timeout=400)
    assert res.returncode == 0, res.stderr
    # seed, confirmed score, frames, minutes, known at, lag s, first at, online at, frames/s,
    # evaluations, the evaluator's CPU share over the run and to the confirmed weights: the
    # confirmed weights (50 games) are those of the first crossing or later.
    rows = re.findall(r"^\s+(\d)\s+\+(\d+\.\d)\s+([\d,]+)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+)"
                      r"\s+([\d,]+)\s+([\d,]+|-)\s+([\d,]+)\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)$",
                      res.stdout, re.M)
    assert [r[0] for r in rows] == ["0", "1"], res.stdout
    for r in rows:
        assert float(r[1]) >= 30 and float(r[4]) >= float(r[3]), res.stdout
        assert int(r[6].replace(",", "")) <= int(r[2].replace(",", "")), res.stdout
    assert re.search(r"^\s*median\s+2/2(\s+[\d,.]+|\s+-){9}$", res.stdout, re.M), res.stdout
    # Run again: both runs are finished, so nothing is trained and the same figures print.
    again = ddrl(*args, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("finished already") == 2, again.stdout
    assert re.findall(r"^\s+\d\s+\+.*$", again.stdout, re.M) == \
        re.findall(r"^\s+\d\s+\+.*$", res.stdout, re.M)


def test_owed_evaluations_play_side_by_side_on_the_cores_the_stopped_run_leaves(tmp_path):
    """Evaluations of 100 games are due every 10 updates, far more often than one plays: the
    weights skipped before the evaluation that hits wait for the run's end, then play on one
    evaluator process per core (as many as there are owed weights), oldest first. None is
    played twice, and the time to target is no later than the hit that stopped the run."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    out = tmp_path / "run"
    res = ddrl("train", JOBS / "cartpole.toml", "--out", out, "--set", "eval.every=10",
               "--set", "eval.episodes=100", "--set", "eval.target=100",
               "--set", "run.max_frames=400000", timeout=300)
    assert res.returncode == 0, res.stderr
    owed = re.search(r"target reached; evaluating the weights skipped before the ones that "
                     r"reached it \((\d+), updates \d+-\d+\), oldest first, until one reaches "
                     r"it; (\d+) evaluator process\(es\)", res.stdout)
    assert owed, res.stdout
    assert int(owed[2]) == min(int(owed[1]), len(os.sched_getaffinity(0)), 1 + MAX_SIBLINGS), owed[0]
    evals = load_run(out)["eval"]
    assert len(np.unique(evals["update"])) == len(evals)
    in_run_hit = next(r for r in table(out, "eval") if r["mean_return"] >= 100)
    assert first_reaching(evals, 100.0)["update"] <= in_run_hit["update"]


def focused_cartpole(out: Path, *sets: str, frames: int) -> subprocess.CompletedProcess:
    """`ddrl train` on CartPole, an evaluation due every 50 updates, focused from the first
    result on (CartPole scores 0 or more), no backfill; `sets`: more KEY=VALUE settings."""
    return ddrl("train", JOBS / "cartpole.toml", "--out", out, "--set", "eval.every=50",
                "--set", "eval.focus_above=0", "--set", "eval.backfill=false",
                "--set", f"run.max_frames={frames}", *[a for s in sets for a in ("--set", s)],
                timeout=300)


@pytest.mark.parametrize("sets", [["eval.pause_share=1"],
                                  ["eval.pause_share=0.001", "sync.virtual_ranks=2",
                                   "acting.mode=a2c"]],
                         ids=["the pause share unbounded", "a rehearsal, whatever the share"])
def test_focused_evaluations_play_every_due_update_while_the_ranks_wait(tmp_path, sets):
    """Evaluations of 10 games every 50 updates, slower than the updates: in the
    background most would be skipped. Focused from the first result on (CartPole scores 0 or
    more), the run waits for each, so every one due after the next two is played at its own
    update (the first focused one starts when the background one ends, at any update; one
    started at the last update before a multiple of 50 still plays through that multiple,
    whose evaluation then starts an update late); a target out of reach (501: CartPole ends
    at 500), and without backfill nothing is owed at the end. A rehearsal measures frames, not
    minutes: eval.pause_share does not bound it."""
    out = tmp_path / "run"
    res = focused_cartpole(out, "eval.episodes=10", "eval.target=501", *sets, frames=100000)
    assert res.returncode == 0, res.stderr
    assert "the ranks wait for each evaluation from now on" in res.stdout, res.stdout
    assert "evaluating the weights" not in res.stdout, res.stdout
    updates = [r["update"] for r in table(out, "eval")][:-1]  # the last: the final evaluation
    assert len(updates) >= 5 and all(b - a == 50 for a, b in zip(updates[3:], updates[4:])), \
        updates


def test_a_focused_evaluation_past_its_hold_limit_plays_on_while_the_ranks_train(tmp_path):
    """Focused evaluations of 200 CartPole games hold the ranks longer than eval.pause_limit
    (0.2 s here): past it each plays on in the background and the ranks train on, so updates
    are logged while it plays (the ranks once waited for its end, up to half of
    sync.timeout)."""
    out = tmp_path / "run"
    res = focused_cartpole(out, "eval.episodes=200", "eval.target=501", "eval.pause_share=1",
                           "eval.pause_limit=0.2", frames=100000)
    assert res.returncode == 0, res.stderr
    assert "the ranks wait for each evaluation from now on" in res.stdout, res.stdout
    released = {int(u) for u in re.findall(
        r"warning: the evaluation of update (\d+) held the ranks \d+ s \(eval.pause_limit 0.2 s "
        r"for 200 games\): it plays on in the background, the ranks train on", res.stderr)}
    assert released, res.stderr
    train = table(out, "train")["wall_time"]
    during = [int(((train > e["wall_time"] + 0.2) & (train < e["wall_time"] + e["seconds"])).sum())
              for e in table(out, "eval") if e["update"] in released]
    assert during and max(during) >= 3, during


def test_a_frozen_evaluator_is_killed_and_replaced_and_the_run_ends(run_dir):
    """An evaluator that takes no CPU time (SIGSTOP here; a read hung on a shared filesystem)
    would hold rank 0 at the end of the run for ever, waiting for its evaluation: after
    sync.timeout without progress it is killed, the next evaluation has a new process, and the
    run ends on its budget."""
    proc = start(run_dir, "--set", "run.max_minutes=0.8", "--set", "run.max_frames=100000000",
                 "--set", "sync.timeout=8")
    try:
        first = worker_of(proc)
        os.kill(first, signal.SIGSTOP)
        second = worker_of(proc, other_than=first)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert re.search(r"warning: the evaluator process froze \(no CPU time for sync.timeout "
                     r"\(8 s\), killed\); the evaluation of update \d+ is lost", err), err
    assert "Traceback" not in err, err
    assert gone(first) and gone(second)


def test_a_focused_crossing_is_confirmed_while_the_ranks_wait(tmp_path):
    """Focused from the first result on, a crossing of 100 is confirmed by 20 games in all,
    played while the ranks wait (its 15 more games at once): the run stops at the confirmed
    weights, whose row holds the 20 games."""
    out = tmp_path / "run"
    res = focused_cartpole(out, "eval.episodes=5", "eval.confirm_episodes=20", "eval.target=100",
                           "eval.pause_share=1", frames=400000)
    assert res.returncode == 0, res.stderr
    found = re.search(r"target 100 reached: the weights of update (\d+) .* over 20 games",
                      res.stdout)
    assert found, res.stdout[-3000:]
    rows = table(out, "eval")
    confirmed = rows[rows["episodes"] == 20]
    assert len(confirmed) == 1 and confirmed["update"][0] == int(found[1])
    assert confirmed["mean_return"][0] >= 100
