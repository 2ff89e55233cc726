"""The update loop every rank runs: batch -> gradients -> sync -> apply -> account -> stop?,
with rank 0 also logging, evaluating and checkpointing.

Control decisions travel in the gradient collective's side channel (`side_channel`), so all
ranks stop after the same update for the same reason.
"""
from __future__ import annotations

import hashlib
import math
import resource
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ddrl.acting.base import Actors
from ddrl.algos.batch import Batch
from ddrl.config import Config
from ddrl.distributed.sync import Sync, SyncResult, TreeSum, Update
from ddrl.distributed.world import World
from ddrl.heap import HeapTrim
from ddrl.learner import Learner
from ddrl.loop.bookkeeping import (
    NONFINITE_LIMIT,
    RANK_FIELDS,
    ROOT_STOPS,
    ActorTally,
    Counters,
    Step,
    Window,
    side_channel,
    stop_reason,
)
from ddrl.loop.checkpoints import CheckpointWriter
from ddrl.loop.evaluator import BackgroundEvaluator, Snapshot, evaluate_here, games_seed
from ddrl.loop.faults import Faults
from ddrl.loop.progress import Progress
from ddrl.loop.records import RootRecords
from ddrl.loop.schedule import EvalSchedule
from ddrl.output import say
from ddrl.rundir import checkpoint
from ddrl.rundir.log import RunLog
from ddrl.seeding import derive_seed
from ddrl.signals import StopSignals

EXIT_SIGNALLED = 3
EXIT_NONFINITE = 5


class Trainer:
    def __init__(self, cfg: Config, world: World, learner: Learner, actors: Actors, sync: Sync,
                 run_dir: Path, counters: Counters, log: RunLog | None,
                 evaluator: BackgroundEvaluator | None):
        self.cfg, self.world, self.learner, self.actors, self.sync = cfg, world, learner, actors, sync
        self.run_dir = run_dir
        self.counters = counters
        self.log = log
        self.evaluator = evaluator
        self.progress = Progress(cfg.run.progress_seconds, cfg.run.max_frames, cfg.run.max_minutes,
                                 start_frames=counters.frames)
        self._faults = Faults(cfg, world.rank)
        self._side = side_channel(world.size)
        self._tally = ActorTally(actors)
        self._window = Window(start=counters.wall_time)
        self._t_origin = time.perf_counter() - counters.wall_time
        self._last_sync = 0.0
        self._nonfinite_streak = 0
        learner.schedule(counters.frames)  # the first update's rate (a warm-up's, a resume's)
        self._records = RootRecords(log, counters, self.progress, run_dir) if world.is_root \
            else None
        self._schedule = self._resumed_schedule() if world.is_root else None
        self._checkpoints = CheckpointWriter(run_dir / "checkpoints", cfg.run, counters.restarts)
        self._heap = HeapTrim()

    def run(self, signals: StopSignals) -> int:
        """`signals` is installed by the caller for the whole process: a signal during
        start-up stops the run at its first update, with a checkpoint."""
        self.actors.start(lambda: signals.received is not None)
        reason = None
        try:
            while reason is None:
                batch, grad, stats, step = self._compute()
                res = self.sync.update(grad, self._side_channel(signals.received is not None,
                                                                step))
                self._apply(res.update)
                side = self._account(step, res)
                if self.world.is_root:
                    self._root_duties(batch, stats, step, res, side["ranks"])
                self._heap.maybe()
                reason = stop_reason(side, self._nonfinite_streak, self.counters.frames,
                                     self.cfg.run.max_frames)
                if reason is None and side["pause"] > 0:
                    self._pause(signals.event)
        except BaseException:
            # Ctrl-C or an error: the actors' threads stop before the process ends. Left
            # running, they infer while C's exit tears TensorFlow down (with 2.18, oneDNN's
            # "could not execute a primitive" and SIGILL in place of the exit code).
            self.actors.close()
            raise
        # Every rank knows now; its own copy of the signal may still be on the way.
        signals.job_stopping = reason == "signal"
        # Still guarded: a signal in the final phase (Slurm's warning when the run's own
        # time limit is close to the allocation's) cuts the final evaluation short, and
        # the last checkpoint is written all the same.
        return self._finish(reason, signals.event)

    def _compute(self) -> tuple[Batch, np.ndarray, dict[str, float], Step]:
        """The next batch and this rank's gradient on it."""
        t0 = time.perf_counter()
        ranks = self.actors.ranks()
        parts = [rank.next_batch() for rank in ranks]  # more than one: virtual ranks
        # Minibatches of unequal sizes (a rollout that does not split evenly) go one by one.
        fused = self.learner.fuses and len({len(p) for p in parts}) == 1
        grad, stats, t_train = (self._fused_gradients if fused else self._gradients)(ranks, parts)
        batch, points = parts[0], sum(len(p) for p in parts)
        self._faults.after_gradients(self.counters.update, time.perf_counter() - t0)
        frames, t_sim, t_predict = self._tally.take()
        step = Step(points, frames, t_train, t_sim, t_predict,
                    time.perf_counter() - t0 + self._last_sync, self._last_sync,
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return batch, grad, stats, step

    def _gradients(self, ranks: list[Actors], parts: list[Batch]
                   ) -> tuple[np.ndarray, dict[str, float], float]:
        """Each rank's gradient on its minibatch in turn, summed (acting/virtual.py): the sum,
        the first rank's figures (logged, as rank 0's are), seconds computing."""
        t_train, total = 0.0, TreeSum()
        for rank, part in zip(ranks, parts):
            t1 = time.perf_counter()
            grad, part_stats, per_sample = self.learner.gradients(part)
            t_train += time.perf_counter() - t1
            rank.learned(per_sample)
            if rank is ranks[0]:
                stats = part_stats
            # The learner's array is its own until the next call: a copy where one follows.
            total.add(grad if len(ranks) == 1 else grad.copy())
        return total.total(), stats, t_train

    def _fused_gradients(self, ranks: list[Actors], parts: list[Batch]
                         ) -> tuple[np.ndarray, dict[str, float], float]:
        """`sync.virtual_fused`: the ranks' minibatches in one gradient call, as `_gradients`."""
        t1 = time.perf_counter()
        grad, stats, per_sample = self.learner.fused_gradients(parts)
        t_train = time.perf_counter() - t1
        for rank, figures in zip(ranks, per_sample):
            rank.learned(figures)
        return grad, stats, t_train

    def _side_channel(self, signalled: bool, step: Step) -> np.ndarray:
        extras = self._side.pack(signalled=float(signalled), frames=step.frames)
        if self.world.is_root:
            self._side.set(extras, "stop", ROOT_STOPS.index(self._root_stop()))
            self._side.set(extras, "pause", self._schedule.pausing)
        start = len(RANK_FIELDS) * self.world.rank
        self._side.get(extras, "ranks")[start:start + len(RANK_FIELDS)] = step.rank_figures()
        return extras

    def _pause(self, stop: threading.Event) -> None:
        """Every rank waits, idle, while rank 0's evaluator plays what they wait for (a
        confirmation, a focused evaluation: see EvalSchedule.pausing) or until the schedule
        releases it past its hold limit; a stop signal ends the wait."""
        if self.world.is_root:
            while self._schedule.pausing and not stop.is_set():
                self._schedule.poll(wait=False)
                time.sleep(0.02)
        self.world.barrier(self.cfg.sync.timeout, "to end a pause")

    def _root_stop(self) -> str:
        """Rank 0 alone evaluates and keeps the clock; frames are global, so all agree on them."""
        if self._schedule.target_reached:
            return "target"
        max_minutes = self.cfg.run.max_minutes
        if max_minutes and self.counters.wall_time >= max_minutes * 60:
            return "time"
        return ""

    def _apply(self, update: Update) -> None:
        """The one place where what a sync backend returns reaches the learner."""
        if update.gradient is not None:
            self.learner.apply(update.gradient)
        if update.weights is not None:
            self.learner.set_weights(update.weights)
        if update.moments is not None:
            self.learner.set_moments(update.moments)

    def _account(self, step: Step, res: SyncResult) -> dict[str, np.ndarray]:
        """Counters after this update; the side channel's sums over the ranks."""
        c = self.counters
        self._nonfinite_streak = 0 if res.finite else self._nonfinite_streak + 1
        self._last_sync = res.seconds
        c.update += 1
        self.actors.update = c.update
        side = self._side.unpack(res.extras)
        c.frames += int(round(side["frames"]))
        self.actors.progress = c.frames / self.cfg.run.max_frames
        self.learner.schedule(c.frames)
        c.wall_time = self._now()
        # A process's step holds its virtual ranks' batches, each counted among the contributors.
        self._window.add(step, res.contributors / len(self.actors.ranks()), res.seconds, res.finite)
        return side

    def _root_duties(self, batch: Batch, stats: dict[str, float], step: Step, res: SyncResult,
                     ranks: np.ndarray) -> None:
        c = self.counters
        self._records.episodes(self.actors.pop_episodes())
        if c.update % self.cfg.run.log_every == 0:
            self._records.update(batch, {**stats, "lr": self.learner.lr,
                                         **self._window.row(c.wall_time),
                                         "owed_dropped": self._schedule.dropped},
                                 step, res, ranks.reshape(self.world.size, len(RANK_FIELDS)))
            self._records.rows(self.actors.pop_rows(self._window.updates))
            self._window = Window(start=c.wall_time)
        self._schedule.poll(wait=False)
        self._schedule.due(c.update, self._snapshot)
        if self._checkpoints.due():
            self._checkpoint(background=True)
        self.progress.maybe_print(c.frames, c.wall_time, c.update)

    def _snapshot(self) -> Snapshot:
        c = self.counters
        return Snapshot(self.learner.get_weights(), c.update, c.frames, c.wall_time)

    def _resumed_schedule(self) -> EvalSchedule:
        cfg, c = self.cfg.eval, self.counters
        if self.cfg.sync.virtual_ranks > 1:
            # A rehearsal measures the big job's frames to the target, not its minutes: every
            # due evaluation is waited for, so the frames are known to eval.every's resolution.
            cfg = replace(cfg, pause_share=1.0, full_share_above=None)
        kept = [Snapshot(u.weights, u.update, u.frames, u.wall_time) for u in
                checkpoint.load_unplayed(self.run_dir / "checkpoints", c.update)
                ] if cfg.target is not None else []
        return EvalSchedule(cfg, self.evaluator,
                            lambda done, newest, held: self._records.evaluation(
                                done, newest, self._now(), held),
                            self._now, c.update, kept, self._records.highest_mean(),
                            self.sync.lockstep, waits=self._records.waits(cfg.episodes),
                            hold_most=self.cfg.sync.timeout / 2,
                            reached=self._records.confirmed(cfg.target, cfg.confirm_episodes))

    def _now(self) -> float:
        """The run's wall time, resumes included."""
        return time.perf_counter() - self._t_origin

    def _checkpoint(self, background: bool = False) -> Path | None:
        """The new checkpoint (None when written in the background); None also when the
        weights are no longer finite, so that a diverged run never rotates its good
        checkpoints out."""
        self._checkpoints.wait()
        # Rows up to the checkpoint must be on disk first (fsynced, as the checkpoint is): a
        # resume keeps exactly those.
        self.log.flush(sync=True)
        self._apply(self.sync.pull_state())
        c = self.counters
        weights = self.learner.get_weights()
        if not np.isfinite(weights).all():
            return None
        # The copies are taken here, between updates.
        return self._checkpoints.write(checkpoint.Checkpoint(
            c.update, c.frames, c.wall_time, c.restarts, weights,
            [a.copy() for a in self.learner.get_optimizer_state()]),
            self._schedule.unplayed(), background)

    def _finish(self, reason: str, signalled: threading.Event) -> int:
        # First: a backend may wait for the other ranks' last exchange (at most sync.timeout).
        final = self.sync.finish()
        if final is not None:
            self._apply(final.update)
            if self.world.is_root:
                self._records.rows(final.rows)
        # The weights first, before anything long (central actors' goodbyes, up to
        # sync.timeout; a replay memory's gigabytes; the final evaluation) or anything that may
        # fail (a sampler's error): the batch system's kill then costs the rest, not them.
        path = self._checkpoint() if self.world.is_root else None
        self._checkpoints.close()
        self.actors.close()
        if reason != "nonfinite":
            # Every rank stops at this update, which the final checkpoint holds.
            self.actors.save_state(self.run_dir / "checkpoints", self.counters.update)
        code = {"signal": EXIT_SIGNALLED, "nonfinite": EXIT_NONFINITE}.get(reason, 0)
        # One line per rank, so anyone can check that all ranks ended with the same weights.
        digest = hashlib.sha256(self.learner.get_weights().tobytes()).hexdigest()[:16]
        say(f"[ddrl] rank {self.world.rank} final weights sha256 {digest}")
        if self.world.is_root and not self._finish_root(reason, signalled, path) and code == 0:
            # The final evaluation was cut short: a resume plays it (exit 3 is resumable).
            code = EXIT_SIGNALLED
        # No rank exits before rank 0 has saved: launchers kill the job when the first exits.
        # Rank 0 comes last (the others wait through its evaluations): it alone has a deadline.
        self._faults.at_end()
        self.world.barrier(self.cfg.sync.timeout if self.world.is_root else math.inf,
                           "at the end of the run")
        return code

    def _finish_root(self, reason: str, signalled: threading.Event, path: Path | None) -> bool:
        """Rank 0's end of the run after its last checkpoint (`path`): evaluations, the log
        closed. False when a stop signal cut them short: the owed ones, the final one."""
        c = self.counters
        if reason != "signal":
            self._schedule.poll(wait=True, stop=signalled)
            left = self._schedule.play_owed(signalled, on_budget=reason in ("frames", "time"))
            # The final checkpoint's owed list was taken before the evaluation then playing
            # ended: rewritten either way, so that a run with nothing owed is not resumed to
            # play it again.
            self._checkpoints.save_unplayed(self._schedule.unplayed() if left is None else left)
        if self.evaluator is not None:
            self.evaluator.cancel()
        complete = reason == "signal" or not signalled.is_set()
        final = reason in ("frames", "time") and self.cfg.eval.episodes
        if complete and final:
            # A run that ends on its budget gets a score for its last weights.
            say(f"[ddrl] final evaluation: {self.cfg.eval.episodes} games with the weights of "
                f"update {c.update}")
            # Played here, on rank 0's own threads, the ranks having stopped.
            done = evaluate_here(self.cfg, self.learner, self._snapshot(),
                                 derive_seed(self.cfg.run.seed, 0, f"final-eval/{c.update}"),
                                 signalled)
            complete = done is not None
            if complete:
                self._schedule.finished(done)
                # A final crossing is confirmed as any other: the run ends knowing its target.
                confirm = None if self._schedule.target_reached else \
                    self._schedule.confirmation(done)
                if confirm is not None:
                    say(f"[ddrl] the final evaluation scored {done.result.mean:.1f}: "
                        f"{confirm.episodes} more games to confirm it")
                    done = evaluate_here(self.cfg, self.learner, confirm,
                                         games_seed(self.cfg, confirm), signalled)
                    complete = done is not None
                    if complete:
                        self._schedule.finished(done)
        if not complete:
            # A resume plays what is left: the owed weights are in checkpoints/unplayed.npz.
            reason = f"{reason}; a stop signal cut its " \
                f"{'final evaluation' if final else 'owed evaluations'} short"
        self.log.close()
        self.progress.maybe_print(c.frames, c.wall_time, c.update, final=True)
        if reason == "nonfinite":
            good = path or checkpoint.latest(self.run_dir / "checkpoints")
            say(f"ddrl: error: the last {NONFINITE_LIMIT} updates had NaN or Inf gradients, so the "
                f"optimisation diverged (try a lower optim.lr); none of them was applied; last "
                f"good checkpoint: {good or 'none (the weights were never finite at a checkpoint)'}",
                err=True)
            return complete
        say(f"[ddrl] stopped ({reason}) after {c.update} updates, {c.frames:,} frames; "
            f"log {self.run_dir / 'log.h5'}, checkpoint {path}")
        return complete
