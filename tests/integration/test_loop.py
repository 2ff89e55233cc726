"""The training loop in process, over a fake learner and fake actors with the real local sync,
run log and checkpoints: why and where it stops, the non-finite streak, the checkpoint
cadence, an evaluation that reaches the target. No TensorFlow, no simulators, no MPI."""
from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from fake_evaluator import FakeEvaluator

from ddrl.algos.batch import Batch
from ddrl.config import load_config
from ddrl.distributed.sync import LocalSync
from ddrl.distributed.world import World
from ddrl.loop.bookkeeping import NONFINITE_LIMIT, Counters
from ddrl.loop.evaluator import Snapshot
from ddrl.loop.trainer import EXIT_NONFINITE, EXIT_SIGNALLED, Trainer
from ddrl.rundir import checkpoint
from ddrl.rundir.log import RunLog
from ddrl.signals import StopSignals

JOBS = Path(__file__).resolve().parents[2] / "jobs"

PARAMS = 8
BATCH = 4
FRAMES_PER_BATCH = 16


class FakeLearner:
    """Plain SGD on a vector; `gradients` hands out what `grads(update)` says."""

    recurrent = 0
    fuses = False

    def __init__(self, grads=lambda update: np.ones(PARAMS, np.float32)):
        self.weights = np.zeros(PARAMS, np.float32)
        self.applied = 0
        self.lr = 0.1
        self.predictions = 0
        self.signal_at = 0  # a stop signal at this inference (only the final evaluation infers)
        self._grads = grads
        self._calls = 0

    def gradients(self, batch: Batch) -> tuple[np.ndarray, dict[str, float], None]:
        self._calls += 1
        return self._grads(self._calls), {"loss": 1.0, "entropy": 0.5}, None

    def apply(self, grad: np.ndarray) -> None:
        self.weights = self.weights - self.lr * grad
        self.applied += 1

    def schedule(self, frames: int) -> None:
        pass

    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Always the first action: the final evaluation's CartPole games end in ~10 steps."""
        self.predictions += 1
        if self.predictions == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return np.tile([1.0, 0.0], (len(obs), 1)), np.zeros(len(obs))

    def get_weights(self) -> np.ndarray:
        return self.weights.copy()

    def set_weights(self, flat: np.ndarray) -> None:
        self.weights = flat.copy()

    def get_optimizer_state(self) -> list[np.ndarray]:
        return [np.full(PARAMS, self.applied, np.float32)]


class FakeActors:
    """Each batch is FRAMES_PER_BATCH new frames; a finished game every other batch;
    `on_batch(n)` runs before the n-th batch (n from 1)."""

    def __init__(self, on_batch=lambda n: None):
        self.frames, self.t_sim, self.t_predict, self.update = 0, 0.0, 0.0, 0
        self.batches = 0
        self.closed = False
        self._on_batch = on_batch

    def start(self, stopping) -> None:
        self.stopping = stopping

    def next_batch(self) -> Batch:
        self.batches += 1
        self._on_batch(self.batches)
        self.frames += FRAMES_PER_BATCH
        return Batch(np.zeros((BATCH, 1), np.float32), np.zeros(BATCH, np.int64),
                     np.full(BATCH, self.update))

    def learned(self, per_sample) -> None:
        pass

    def ranks(self) -> list["FakeActors"]:
        return [self]

    def pop_episodes(self) -> list[tuple[float, int]]:
        return [(float(self.batches), 10)] if self.batches % 2 == 0 else []

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        return {}

    def close(self) -> None:
        self.closed = True

    def save_state(self, directory: Path, update: int) -> None:
        pass


def make_trainer(tmp_path: Path, sets: list[str], learner=None, actors=None, evaluator=None):
    # Every crossing counts as it is unless a test asks for confirmations.
    cfg = load_config(JOBS / "cartpole.toml", ["eval.target=none", "run.progress_seconds=1000",
                                             "eval.confirm_episodes=0", *sets])
    world = World()
    log = RunLog.create(tmp_path / "log.h5", {"config": cfg.to_json()})
    trainer = Trainer(cfg, world, learner or FakeLearner(), actors or FakeActors(),
                      LocalSync(world), tmp_path, Counters(), log, evaluator)
    return trainer


def run(trainer: Trainer) -> int:
    """As `ddrl train` runs it: the stop signals are the process's for the whole run."""
    with StopSignals() as signals:
        return trainer.run(signals)


def rows(tmp_path: Path, table: str) -> np.ndarray:
    with h5py.File(tmp_path / "log.h5", "r") as f:
        return f[table][:]


def test_stops_on_frames_with_a_checkpoint_of_the_last_update(tmp_path):
    trainer = make_trainer(tmp_path, [f"run.max_frames={10 * FRAMES_PER_BATCH}", "run.log_every=3"])
    assert run(trainer) == 0
    assert trainer.counters.update == 10 and trainer.counters.frames == 160
    assert trainer.learner.applied == 10 and trainer.actors.closed
    ckpt = checkpoint.load(checkpoint.latest(tmp_path / "checkpoints"))
    assert (ckpt.update, ckpt.frames) == (10, 160)
    np.testing.assert_allclose(ckpt.weights, -1.0, rtol=1e-6)
    train = rows(tmp_path, "train")
    assert train["update"].tolist() == [3, 6, 9] and (train["loss"] == 1.0).all()
    assert train["dp_per_s"].min() > 0 and (train["contributors"] == 1).all()
    assert rows(tmp_path, "episodes")["return"].tolist() == [2, 4, 6, 8, 10]
    assert rows(tmp_path, "ranks")["frames"].tolist() == [FRAMES_PER_BATCH] * 3


def test_a_nonfinite_streak_stops_the_run_and_none_of_it_is_applied(tmp_path):
    bad_from = 5
    learner = FakeLearner(lambda n: np.full(PARAMS, np.nan if n >= bad_from else 1.0, np.float32))
    trainer = make_trainer(tmp_path, ["run.max_frames=100000", "run.log_every=1"], learner=learner)
    assert run(trainer) == EXIT_NONFINITE
    assert trainer.counters.update == bad_from - 1 + NONFINITE_LIMIT
    assert learner.applied == bad_from - 1
    np.testing.assert_allclose(learner.weights, -0.1 * (bad_from - 1), rtol=1e-6)
    assert rows(tmp_path, "train")["nonfinite"].sum() == NONFINITE_LIMIT


def test_isolated_nonfinite_gradients_are_dropped_and_the_run_goes_on(tmp_path):
    learner = FakeLearner(lambda n: np.full(PARAMS, np.inf if n % 3 == 0 else 1.0, np.float32))
    trainer = make_trainer(tmp_path, [f"run.max_frames={12 * FRAMES_PER_BATCH}"], learner=learner)
    assert run(trainer) == 0
    assert trainer.counters.update == 12 and learner.applied == 8


def test_a_stop_signal_ends_after_that_update_with_its_checkpoint(tmp_path):
    actors = FakeActors(on_batch=lambda n: os.kill(os.getpid(), signal.SIGUSR1) if n == 7 else None)
    trainer = make_trainer(tmp_path, ["run.max_frames=100000"], actors=actors)
    previous = signal.getsignal(signal.SIGUSR1)
    assert run(trainer) == EXIT_SIGNALLED
    assert trainer.counters.update == 7
    assert checkpoint.load(checkpoint.latest(tmp_path / "checkpoints")).update == 7
    # A second signal after the orderly stop is ignored, not fatal; then it is the caller's.
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    signal.signal(signal.SIGUSR1, previous)


def test_checkpoints_follow_the_cadence_and_rotate(tmp_path):
    trainer = make_trainer(tmp_path, [f"run.max_frames={6 * FRAMES_PER_BATCH}",
                                      "run.checkpoint_minutes=1e-9", "run.keep_checkpoints=2"])
    assert run(trainer) == 0
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob(f"{checkpoint.PREFIX}*"))
    assert kept == ["ckpt-0000000005.npz", "ckpt-0000000006.npz"]


def test_no_periodic_checkpoint_before_its_time(tmp_path):
    trainer = make_trainer(tmp_path, [f"run.max_frames={6 * FRAMES_PER_BATCH}",
                                      "run.checkpoint_minutes=60"])
    assert run(trainer) == 0
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob(f"{checkpoint.PREFIX}*"))
    assert kept == ["ckpt-0000000006.npz"]  # the final one only


def test_the_time_budget_stops_the_run(tmp_path):
    trainer = make_trainer(tmp_path, ["run.max_frames=100000000", "run.max_minutes=1e-9"])
    assert run(trainer) == 0
    # Rank 0 reads its clock before each update and the stop travels with the next one.
    assert trainer.counters.update == 2


# Evaluations start every 2 updates and are read at the next; the stop travels in the update
# after that: a score of 6 (started at 6, read at 7) stops after update 8.
@pytest.mark.parametrize("target, stops_at", [(5.0, 8), (100.0, 12)])
def test_an_evaluation_at_the_target_stops_the_run_and_keeps_the_best(tmp_path, target, stops_at):
    evaluator = FakeEvaluator(score=lambda update: float(update))
    trainer = make_trainer(tmp_path, [f"run.max_frames={12 * FRAMES_PER_BATCH}", "eval.every=2",
                                      f"eval.target={target}"], evaluator=evaluator)
    assert run(trainer) == 0
    assert trainer.counters.update == stops_at
    best = checkpoint.load(tmp_path / "checkpoints" / checkpoint.BEST)
    assert best.score == rows(tmp_path, "eval")["mean_return"].max()


def test_a_stop_signal_during_start_up_stops_at_the_first_update_with_its_checkpoint(tmp_path):
    """The signal arrives before the loop (TensorFlow's import, the broadcasts): the run
    still ends in order, resumable, instead of dying with the default action."""
    trainer = make_trainer(tmp_path, ["run.max_frames=100000"])
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        with StopSignals() as signals:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert trainer.run(signals) == EXIT_SIGNALLED
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert trainer.counters.update == 1
    assert checkpoint.load(checkpoint.latest(tmp_path / "checkpoints")).update == 1


def test_a_stop_signal_in_the_final_evaluation_cuts_it_short_and_still_checkpoints(tmp_path):
    """Slurm's warning often comes while a run that hit run.max_minutes evaluates its last
    weights: the evaluation stops, the checkpoint is written, and the exit says resumable."""
    learner = FakeLearner()
    learner.signal_at = 5
    trainer = make_trainer(tmp_path, [f"run.max_frames={4 * FRAMES_PER_BATCH}",
                                      "eval.episodes=2000"], learner=learner)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert run(trainer) == EXIT_SIGNALLED
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert 5 <= learner.predictions < 2000 // 16  # far fewer than the games asked for
    assert checkpoint.load(checkpoint.latest(tmp_path / "checkpoints")).update == 4
    assert len(rows(tmp_path, "eval")) == 0


# The weights due every 2 updates that evaluations taking 7 skip before update 20: owed after
# the run, and played oldest first up to 20's, the first to reach the target.
OWED_TO_20 = [4, 6, 8, 10, 12, 14, 18, 20]


# After the run the owed evaluations play on one evaluator process or on several side by side
# (one per core): the same evaluations are logged, the same time to target found.
@pytest.mark.parametrize("processes", [1, 3])
def test_weights_skipped_while_the_evaluator_played_are_evaluated_after_the_target_is_hit(
        tmp_path, processes):
    """Evaluations take 7 updates, so of the weights due every 2 updates three in four wait.
    Those of update 20 reach the target first but are skipped; 23's are evaluated and hit it.
    The run ends, then all the weights skipped before 23 play, oldest first (also those before
    the evaluations of 9 and 16, which missed), until one hits: 4 to 18 (below), 20; 22 is
    never played (on 3 processes it starts beside 18 and 20 and is abandoned). The run's time
    to target is 20's, the one an evaluation every 2 updates would have found."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    on_disk = []

    def score(update: int) -> float:
        if update == 4:  # the first owed: the final checkpoint is written
            on_disk.extend(k.update for k in checkpoint.load_unplayed(tmp_path / "checkpoints",
                                                                      up_to=10**9))
        return update if update >= 20 else 0.0

    evaluator = FakeEvaluator(score, polls=7, processes=processes)
    trainer = make_trainer(tmp_path, ["run.max_frames=100000", "eval.every=2", "eval.target=18"],
                           evaluator=evaluator)
    assert run(trainer) == 0
    assert evaluator.started == [2, 9, 16, 23, *OWED_TO_20, *([22] if processes > 1 else [])]
    # The final checkpoint keeps what the run owes (a kill during the owed play loses none).
    assert on_disk == [*OWED_TO_20, 22]
    assert rows(tmp_path, "eval")["update"].tolist() == [2, 9, 16, 23, *OWED_TO_20]
    hit = first_reaching(load_run(tmp_path)["eval"], 18.0)
    assert (hit["update"], hit["frames"]) == (20, 20 * FRAMES_PER_BATCH)
    # 23's score is read at update 30; the stop travels in the next: no evaluation after it.
    assert trainer.counters.update == 31 and trainer.progress.eval_score == 23  # the newest


def test_the_progress_line_shows_a_cut_evaluation_marked(tmp_path, capsys):
    """A run far from its target cuts every evaluation: the line shows the newest one's mean,
    marked, not "-" for the whole run."""
    evaluator = FakeEvaluator(lambda u: u - 10_000.0)
    evaluator.cut_below = 0.0
    trainer = make_trainer(tmp_path, ["run.max_frames=12000", "eval.every=2", "eval.target=18",
                                      "eval.backfill=false", "run.progress_seconds=1e-6"],
                           evaluator=evaluator)
    assert run(trainer) == 0
    out = capsys.readouterr().out
    # The last line before the final evaluation (which plays the last weights in full).
    last = [line for line in out[:out.index("final evaluation")].splitlines()
            if "frames/s" in line][-1]
    assert re.search(r"eval -\d+\.\d \(cut\)", last), last


@pytest.mark.parametrize("processes", [1, 3])
def test_a_run_that_uses_its_budget_without_a_hit_plays_the_weights_its_evaluator_had_no_time_for(
        tmp_path, processes):
    """Evaluations take 7 updates; the run ends on its frames at update 27, and none of its
    evaluations (2, 9, 16, 23) reached the target. The weights due meanwhile play, oldest
    first, until one hits: 4 to 18 (below), 20 (hits); 22, 24 and 26, after the hit, are owed
    no more. Then the final evaluation of the last weights, as for any budget stop."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    evaluator = FakeEvaluator(score=lambda update: 20.0 if update in (20, 24) else 0.0, polls=7,
                              processes=processes)
    trainer = make_trainer(tmp_path, [f"run.max_frames={27 * FRAMES_PER_BATCH}", "eval.every=2",
                                      "eval.target=18"], evaluator=evaluator)
    assert run(trainer) == 0
    assert evaluator.started == [2, 9, 16, 23, *OWED_TO_20, *([22] if processes > 1 else [])]
    evals = rows(tmp_path, "eval")
    assert evals["update"].tolist() == [2, 9, 16, 23, *OWED_TO_20, 27]
    # The final evaluation, played by rank 0 itself, logs what it took too.
    assert evals["seconds"][-1] > 0 and evals["cpu_seconds"][-1] > 0, evals[-1]
    hit = first_reaching(load_run(tmp_path)["eval"], 18.0)
    assert (hit["update"], hit["frames"]) == (20, 20 * FRAMES_PER_BATCH)
    assert checkpoint.load_unplayed(tmp_path / "checkpoints", 27) == []


@pytest.mark.parametrize("score_of_8", [0.0, 20.0])
def test_an_evaluation_that_ends_after_the_final_checkpoint_is_owed_no_more(tmp_path, score_of_8):
    """The run ends on its frames at update 10 while 8's evaluation, the last due, still
    plays: the final checkpoint keeps 8's weights as owed, then the run waits for it to end
    (below the target, or a hit). Nothing is owed after that: `ddrl status` calls the run
    finished, and a resume would not play 8 again."""
    evaluator = FakeEvaluator(score=lambda update: score_of_8 if update == 8 else 0.0,
                              polls=lambda update: 100 if update == 8 else 1)
    trainer = make_trainer(tmp_path, [f"run.max_frames={10 * FRAMES_PER_BATCH}", "eval.every=4",
                                      "eval.target=18"], evaluator=evaluator)
    assert run(trainer) == 0
    assert evaluator.started == [4, 8]
    assert rows(tmp_path, "eval")["update"].tolist()[:2] == [4, 8]
    assert checkpoint.load_unplayed(tmp_path / "checkpoints", 10) == []

def test_owed_evaluations_side_by_side_find_the_earliest_hit_whichever_ends_first(tmp_path):
    """Three processes: 16's evaluation is slow (below the target), 18's slower (a hit), 20's
    quick (a hit): 20's ends first, yet the time to target is 18's, which ends last; 22's,
    after a known hit, never starts."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    evaluator = FakeEvaluator(score=lambda update: 0.0 if update < 18 else 20.0,
                              polls=lambda update: {16: 5, 18: 9}.get(update, 1), processes=3)
    trainer = make_trainer(tmp_path, ["eval.target=18"], evaluator=evaluator)
    owed = [Snapshot(np.zeros(1, np.float32), u, u * FRAMES_PER_BATCH, float(u))
            for u in (16, 18, 20, 22)]
    left = trainer._schedule.play_in_order(owed, [evaluator, *evaluator.siblings(3)], threading.Event())
    trainer.log.close()
    assert evaluator.started == [16, 18, 20] and left == []
    assert rows(tmp_path, "eval")["update"].tolist() == [20, 16, 18]  # in the order they ended
    assert first_reaching(load_run(tmp_path)["eval"], 18.0)["update"] == 18


def test_a_stop_during_the_owed_evaluations_leaves_the_run_resumable_and_the_resume_plays_them(
        tmp_path):
    """As the first test above, but a stop signal arrives as the owed evaluations begin (4's
    starts): the run exits resumable, not finished, with 4 to 22 in unplayed.npz. The resumed
    run, past its hit, trains one update and plays them until one hits: 20."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    def score(update: int) -> float:
        if update == 4 and not resumed:
            os.kill(os.getpid(), signal.SIGUSR1)
        return update if update >= 20 else 0.0

    resumed = False
    sets = ["run.max_frames=100000", "eval.every=2", "eval.target=18", "eval.confirm_episodes=0"]
    first = FakeEvaluator(score, polls=7)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert run(make_trainer(tmp_path, sets, evaluator=first)) == EXIT_SIGNALLED
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert first.started == [2, 9, 16, 23, 4]
    assert rows(tmp_path, "eval")["update"].tolist() == [2, 9, 16, 23]
    ckpt = checkpoint.load(checkpoint.latest(tmp_path / "checkpoints"))
    assert [k.update for k in checkpoint.load_unplayed(tmp_path / "checkpoints", ckpt.update)] \
        == [*OWED_TO_20, 22]

    resumed = True
    cfg = load_config(JOBS / "cartpole.toml", ["run.progress_seconds=1000", *sets])
    log = RunLog.resume(tmp_path / "log.h5", ckpt.update, ckpt.frames, 1, {})
    learner = FakeLearner()
    learner.set_weights(ckpt.weights)
    second = FakeEvaluator(score)
    trainer = Trainer(cfg, World(), learner, FakeActors(), LocalSync(World()), tmp_path,
                      Counters(ckpt.update, ckpt.frames, ckpt.wall_time, 1), log, second)
    assert run(trainer) == 0
    assert trainer.counters.update == ckpt.update + 1 and second.started == OWED_TO_20
    hit = first_reaching(load_run(tmp_path)["eval"], 18.0)
    assert (hit["update"], hit["frames"]) == (20, 20 * FRAMES_PER_BATCH)


def test_weights_not_yet_evaluated_at_a_stop_are_played_once_the_resumed_run_hits_the_target(
        tmp_path):
    """As above, but a stop signal ends the run at update 21, while 16's evaluation plays and
    18's and 20's wait: the checkpoint keeps them, with 16's and all those skipped before 16
    (played had 16 hit). The resumed run evaluates 22, which hits; then the kept weights play,
    oldest first, until one hits: 20, the time to target the run without the stop found."""
    from analysis.load import load_run
    from analysis.scores import first_reaching

    def score(update: int) -> float:
        return update if update >= 20 else 0.0

    sets = ["run.max_frames=100000", "eval.every=2", "eval.target=18", "eval.confirm_episodes=0"]
    first = FakeEvaluator(score, polls=7)
    actors = FakeActors(on_batch=lambda n: os.kill(os.getpid(), signal.SIGUSR1) if n == 21 else None)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert run(make_trainer(tmp_path, sets, actors=actors, evaluator=first)) == EXIT_SIGNALLED
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert first.started == [2, 9, 16]
    kept = checkpoint.load_unplayed(tmp_path / "checkpoints", 21)
    assert [k.update for k in kept] == [4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert [k.frames for k in kept] == [k.update * FRAMES_PER_BATCH for k in kept]
    # A resume from an older checkpoint drops those taken after it.
    assert [k.update for k in checkpoint.load_unplayed(tmp_path / "checkpoints", 15)] == \
        [4, 6, 8, 10, 12, 14]

    ckpt = checkpoint.load(checkpoint.latest(tmp_path / "checkpoints"))
    cfg = load_config(JOBS / "cartpole.toml", ["run.progress_seconds=1000", *sets])
    counters = Counters(ckpt.update, ckpt.frames, ckpt.wall_time, 1)
    log = RunLog.resume(tmp_path / "log.h5", ckpt.update, ckpt.frames, 1, {})
    learner = FakeLearner()
    learner.set_weights(ckpt.weights)
    second = FakeEvaluator(score)
    resumed = Trainer(cfg, World(), learner, FakeActors(), LocalSync(World()), tmp_path,
                      counters, log, second)
    assert run(resumed) == 0
    assert second.started == [22, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    hit = first_reaching(load_run(tmp_path)["eval"], 18.0)
    assert (hit["update"], hit["frames"]) == (20, 20 * FRAMES_PER_BATCH)


def test_a_crossing_counts_once_the_same_weights_confirm_it_over_50_games(tmp_path, capsys):
    sets = ["run.max_frames=100000", "eval.every=5", "eval.target=18", "eval.confirm_episodes=50"]
    evaluator = FakeEvaluator(lambda u: 20.0 if u >= 10 else 0.0)
    trainer = make_trainer(tmp_path, sets, evaluator=evaluator)
    assert run(trainer) == 0
    evals = rows(tmp_path, "eval")
    assert evals["update"].tolist()[:3] == [5, 10, 10]
    assert evals["episodes"].tolist()[:3] == [10, 10, 50]
    assert evaluator.started[:3] == [5, 10, 10]  # the confirmation follows at once
    out = capsys.readouterr().out
    assert "[ddrl] target 18 reached: the weights of update 10" in out and "over 50 games" in out
    from analysis.load import load_run
    from analysis.summary import summarize

    row = summarize([load_run(tmp_path)]).iloc[0]
    assert row["frames_to_confirmed"] == 10 * FRAMES_PER_BATCH
    # Known after the weights were taken, within this short run's wall time.
    assert 0 <= row["detection_lag"] <= row["wall_time"]
    from analysis.summary import headline

    assert headline(row).startswith(f"{row['run']}: target 18 confirmed at ")


def test_a_crossing_the_confirmation_does_not_hold_is_no_target(tmp_path):
    """19 over the first 10 games, 15 over the next 40: 15.8 over 50, below 18; the run trains
    on, and the crossing at 30 whose confirmation holds is the target."""
    sets = ["run.max_frames=100000", "eval.every=10", "eval.target=18", "eval.confirm_episodes=50"]
    evaluator = FakeEvaluator(lambda u: 19.0 if u >= 10 else 0.0,
                              confirm_score=lambda u: 19.0 if u >= 30 else 15.0)
    trainer = make_trainer(tmp_path, sets, evaluator=evaluator)
    assert run(trainer) == 0
    evals = rows(tmp_path, "eval")
    confirmed = evals[evals["episodes"] == 50]
    assert confirmed["mean_return"].tolist()[0] == pytest.approx(15.8)
    first_hit = confirmed[confirmed["mean_return"] >= 18]
    assert first_hit["update"].tolist()[0] == 30
    assert trainer.counters.update > 30


@pytest.mark.parametrize("pause", [True, False])
def test_the_ranks_pause_while_a_confirmation_plays_unless_told_not_to(tmp_path, pause):
    """Each evaluation takes 6 updates' polls. Paused, the run trains no update while update
    10's confirmation plays and stops just after it; not paused, it trains through it."""
    sets = ["run.max_frames=100000", "eval.every=5", "eval.target=18", "eval.confirm_episodes=50",
            f"eval.pause_to_confirm={str(pause).lower()}"]
    evaluator = FakeEvaluator(lambda u: 20.0 if u >= 10 else 0.0,
                              polls=lambda u: 1 if u < 10 else 6)
    trainer = make_trainer(tmp_path, sets, evaluator=evaluator)
    assert run(trainer) == 0
    assert evaluator.started[:3] == [5, 10, 10]
    assert trainer.counters.update == (18 if pause else 23)


def test_a_final_evaluation_at_the_target_is_confirmed_before_the_run_ends(tmp_path, capsys):
    """A run that meets its budget with a crossing in its final evaluation plays the
    confirmation's games too: it ends knowing its target (it ended with 4 games and none
    confirmed). The fake learner's CartPole games score about 10, over the target of 5."""
    trainer = make_trainer(tmp_path, [f"run.max_frames={4 * FRAMES_PER_BATCH}",
                                      "eval.episodes=4", "eval.target=5",
                                      "eval.confirm_episodes=12"])
    assert run(trainer) == 0
    evals = rows(tmp_path, "eval")
    assert evals["episodes"].tolist() == [4, 12] and (evals["update"] == 4).all()
    assert evals["mean_return"][1] >= 5
    assert "[ddrl] target 5 reached: the weights of update 4" in capsys.readouterr().out


def test_a_resumed_run_focuses_as_it_had_on_evaluations_that_were_cut(tmp_path):
    """Below the target every Pong evaluation is cut (eval.max_return): no score, but the live
    run focuses on its mean (eval.focus_above) and takes the whole pause share past
    eval.full_share_above. A run resumed after such evaluations does the same: the next due
    evaluation holds the ranks, where the old code played it in the background at niceness 19
    (a resumed Pong run knew its crossing minutes late) and halved the share."""
    sets = ["run.max_frames=100000", "eval.every=2", "eval.target=18", "eval.focus_above=-21",
            "eval.full_share_above=0", "eval.pause_share=1", "run.progress_seconds=1000"]
    cfg = load_config(JOBS / "cartpole.toml", sets)
    log = RunLog.create(tmp_path / "log.h5", {"config": cfg.to_json()})
    for update, mean in ((2, -4.9), (4, 11.7)):
        log.append("eval", {"update": update, "frames": update * FRAMES_PER_BATCH,
                            "mean_return": mean, "episodes": 10, "cut": 1})
    log.close()
    log = RunLog.resume(tmp_path / "log.h5", 5, 5 * FRAMES_PER_BATCH, 1, {})
    trainer = Trainer(cfg, World(), FakeLearner(), FakeActors(), LocalSync(World()), tmp_path,
                      Counters(5, 5 * FRAMES_PER_BATCH, 5.0, 1), log,
                      FakeEvaluator(lambda update: 0.0, polls=10))
    schedule = trainer._schedule
    schedule.due(6, trainer._snapshot)
    log.close()
    assert schedule.focused and schedule.near and schedule.pausing
