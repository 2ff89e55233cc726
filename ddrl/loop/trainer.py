"""The update loop every rank runs: batch -> gradients -> sync -> apply -> account -> stop?,
with rank 0 also logging, evaluating and checkpointing.

Control decisions travel in the gradient collective's side channel (`side_channel`), so all
ranks stop after the same update for the same reason.
"""
from __future__ import annotations

import hashlib
import resource
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ddrl import checkpoint
from ddrl.acting.base import Actors
from ddrl.algos.batch import Batch
from ddrl.config import Config
from ddrl.distributed.sync import Sync, SyncResult, TreeSum, Update
from ddrl.distributed.world import World
from ddrl.learner import Learner
from ddrl.log import RunLog
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
from ddrl.loop.evaluator import BackgroundEvaluator, EvalDone, Snapshot, evaluate
from ddrl.loop.faults import Faults
from ddrl.loop.progress import Progress
from ddrl.output import say
from ddrl.seeding import derive_seed
from ddrl.signals import StopSignals

EXIT_SIGNALLED = 3
EXIT_NONFINITE = 5
# The weights kept for evaluations skipped while the evaluator played (see _maybe_start_eval),
# all since the run's start: at most this many bytes, the oldest dropped first.
SKIPPED_BYTES = 256 << 20


def _save(directory: Path, ckpt: checkpoint.Checkpoint, keep: int,
          unplayed: list[checkpoint.Checkpoint]) -> Path:
    # The unplayed weights first: a stop between the two leaves some newer than the checkpoint,
    # which a resume drops, rather than the checkpoint without its newest unplayed.
    checkpoint.save_unplayed(directory, unplayed)
    return checkpoint.save(directory, ckpt, keep)


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds))


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
        self._target_reached = False
        self._eval_mark = counters.update  # the update of the last evaluation started
        self._skipped: list[Snapshot] = []  # due while the evaluator played, since its start
        # All those skipped before the last evaluation started, whatever the evaluations
        # between them scored (a noisy score below the target says nothing certain of earlier
        # weights): after a hit, those before the hit (no evaluation starts after one).
        self._gap: list[Snapshot] = []
        self._best = checkpoint.best_score(run_dir / "checkpoints") if world.is_root else None
        if world.is_root and cfg.eval.target is not None:
            kept = [Snapshot(u.weights, u.update, u.frames, u.wall_time) for u in
                    checkpoint.load_unplayed(run_dir / "checkpoints", counters.update)]
            # Resumed after its hit (a stop cut the owed evaluations short): it trains no
            # further and plays the weights it still owes.
            self._target_reached = self._best is not None and self._best >= cfg.eval.target
            if self._target_reached:
                self._gap = kept
            else:
                self._skipped = kept
        self._last_checkpoint = time.monotonic()
        # Periodic checkpoints are written off the training thread (a large net's .npz takes
        # seconds on a slow shared filesystem); one at a time, and a failed write surfaces at
        # the next checkpoint or at the end.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ddrl-checkpoint")
        self._writing: Future | None = None

    def run(self, signals: StopSignals) -> int:
        """`signals` is installed by the caller for the whole process: a signal during
        start-up stops the run at its first update, with a checkpoint."""
        self.actors.start(lambda: signals.received is not None)
        reason = None
        while reason is None:
            batch, grad, stats, step = self._compute()
            res = self.sync.update(grad, self._side_channel(signals.received is not None, step))
            self._apply(res.update)
            side = self._account(step, res)
            if self.world.is_root:
                self._root_duties(batch, stats, step, res, side["ranks"])
            reason = stop_reason(side, self._nonfinite_streak, self.counters.frames,
                                 self.cfg.run.max_frames)
        # Every rank knows now; its own copy of the signal may still be on the way.
        signals.job_stopping = reason == "signal"
        # Still guarded: a signal in the final phase (Slurm's warning when the run's own
        # time limit is close to the allocation's) cuts the final evaluation short, and
        # the last checkpoint is written all the same.
        return self._finish(reason, signals.event)

    def _compute(self) -> tuple[Batch, np.ndarray, dict[str, float], Step]:
        """The next batch and this rank's gradient on it."""
        t0 = time.perf_counter()
        t_train, total, points = 0.0, TreeSum(), 0
        ranks = self.actors.ranks()
        for i, rank in enumerate(ranks):  # more than one: virtual ranks (acting/virtual.py)
            part = rank.next_batch()
            t1 = time.perf_counter()
            grad, part_stats = self.learner.gradients(part)
            t_train += time.perf_counter() - t1
            rank.learned(self.learner.per_sample)
            points += len(part)
            if i == 0:  # the first rank's batch and figures are logged, as rank 0's are
                batch, stats = part, part_stats
            # The learner's array is its own until the next call: a copy where one follows.
            total.add(grad if len(ranks) == 1 else grad.copy())
        self._faults.after_gradients(self.counters.update, time.perf_counter() - t0)
        frames, t_sim, t_predict = self._tally.take()
        step = Step(points, frames, t_train, t_sim, t_predict,
                    time.perf_counter() - t0 + self._last_sync, self._last_sync,
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return batch, total.total(), stats, step

    def _side_channel(self, signalled: bool, step: Step) -> np.ndarray:
        extras = self._side.pack(signalled=float(signalled), frames=step.frames)
        if self.world.is_root:
            self._side.set(extras, "stop", ROOT_STOPS.index(self._root_stop()))
        start = len(RANK_FIELDS) * self.world.rank
        self._side.get(extras, "ranks")[start:start + len(RANK_FIELDS)] = step.rank_figures()
        return extras

    def _root_stop(self) -> str:
        """Rank 0 alone evaluates and keeps the clock; frames are global, so all agree on them."""
        if self._target_reached:
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
        c.wall_time = time.perf_counter() - self._t_origin
        # A process's step holds its virtual ranks' batches, each counted among the contributors.
        self._window.add(step, res.contributors / len(self.actors.ranks()), res.seconds, res.finite)
        return side

    def _root_duties(self, batch: Batch, stats: dict[str, float], step: Step, res: SyncResult,
                     ranks: np.ndarray) -> None:
        c = self.counters
        self._log_episodes()
        if c.update % self.cfg.run.log_every == 0:
            self._log_update(batch, stats, step, res,
                             ranks.reshape(self.world.size, len(RANK_FIELDS)))
        self._poll_eval(wait=False)
        self._maybe_start_eval()
        if time.monotonic() - self._last_checkpoint >= self.cfg.run.checkpoint_minutes * 60:
            self._checkpoint(background=True)
            self._last_checkpoint = time.monotonic()
        self.progress.maybe_print(c.frames, c.wall_time, c.update)

    def _log_episodes(self) -> None:
        c = self.counters
        for ret, length in self.actors.pop_episodes():
            # Stamped with the global frame count at this update: the x axis of every curve.
            self.log.append("episodes", {"rank": 0, "frames": c.frames, "wall_time": c.wall_time,
                                         "return": ret, "length": length})
            self.progress.online.append(ret)

    def _log_update(self, batch: Batch, stats: dict[str, float], step: Step, res: SyncResult,
                    ranks: np.ndarray) -> None:
        """A `/train` row for the window since the last one, a `/ranks` row per rank."""
        c = self.counters
        self.log.append("train", {
            "update": c.update, "frames": c.frames, "wall_time": c.wall_time,
            **stats, "lr": self.learner.lr, **self._window.row(c.wall_time),
            "contributors": res.contributors, "effective_batch": len(batch) * res.contributors,
            "policy_lag": float(c.update - 1 - batch.acted_at.mean()),
            "dropped": res.dropped, "staleness": res.staleness,
            "t_sim": step.t_sim, "t_predict": step.t_predict, "restart": c.restarts})
        # A rank's figures may sum several of its steps since rank 0's previous update.
        reports = np.ones(len(ranks)) if res.reports is None else np.maximum(res.reports, 1)
        contributed = np.ones(len(ranks), int) if res.applied is None else res.applied
        for r, row in enumerate(ranks):
            self.log.append("ranks", {"update": c.update, "wall_time": c.wall_time, "rank": r,
                                      **dict(zip(RANK_FIELDS, row / reports[r])),
                                      "contributed": contributed[r]})
        self._log_rows(res.rows)
        self._log_rows(self.actors.pop_rows(self._window.updates))
        self._window = Window(start=c.wall_time)

    def _maybe_start_eval(self) -> None:
        """At each eval.every-th update, or at the first after it when the evaluator was still
        playing or over its CPU share then: the newest weights first, so the run follows its
        progress. With a target, the weights due meanwhile are kept and played once the run
        is over (`_play_owed`): the evaluator's pace (a nice-19 evaluator takes minutes per
        evaluation of long games) delays the run's end, not its time to target."""
        c, ev, every = self.counters, self.evaluator, self.cfg.eval.every
        if ev is None or not self.cfg.eval.episodes or self._target_reached \
                or c.update // every <= self._eval_mark // every:
            return
        if not ev.busy and ev.within_budget():
            ev.start(self._snapshot())
            self._gap, self._skipped = [*self._gap, *self._skipped], []
            self._eval_mark = c.update
            return
        last_kept = self._skipped[-1].update if self._skipped else self._eval_mark
        if self.cfg.eval.target is not None and c.update // every > last_kept // every:
            self._skipped.append(self._snapshot())
            over = len(self._gap) + len(self._skipped) - max(
                1, SKIPPED_BYTES // self._skipped[-1].weights.nbytes)
            if over > 0:
                dropped = min(over, len(self._gap))
                del self._gap[:dropped]
                del self._skipped[:over - dropped]

    def _unplayed(self) -> list[Snapshot]:
        """The weights due and not yet scored: those skipped before the last evaluation, its
        own while it plays, those skipped since; after a hit, those skipped before it (the
        later ones cannot come before it)."""
        if self.cfg.eval.target is None:
            return []
        if self._target_reached:
            return list(self._gap)
        playing = self.evaluator.playing if self.evaluator is not None else None
        return [*self._gap, *([playing] if playing else []), *self._skipped]

    def _snapshot(self) -> Snapshot:
        c = self.counters
        return Snapshot(self.learner.get_weights(), c.update, c.frames, c.wall_time)

    def _poll_eval(self, wait: bool, stop: threading.Event | None = None) -> None:
        """A finished evaluation logged; one that crossed the target goes on at once with its
        confirmation (waited for too, with `wait`)."""
        while self.evaluator is not None:
            done = self.evaluator.poll(wait=wait, stop=stop)
            if done is None:
                return
            self._log_eval(done)
            confirm = self._confirmation(done)
            if confirm is None:
                return
            self.evaluator.start(confirm)
            if not wait:
                return

    def _confirmation(self, done: EvalDone) -> Snapshot | None:
        """The games still owed by weights whose evaluation crossed the target, before the
        crossing counts (eval.confirm_episodes in all); None when there are none."""
        target, res, needed = self.cfg.eval.target, done.result, self.cfg.eval.confirm_episodes
        if target is None or res.mean < target or res.episodes >= needed:
            return None
        return Snapshot(done.weights, done.update, done.frames, done.wall_time, prior=res,
                        episodes=needed - res.episodes)

    def _play_owed(self, stop: threading.Event, on_budget: bool) -> None:
        """The weights due and not yet scored, oldest first, until one reaches the target (the
        run is over: the evaluator has the cores, and as many evaluator processes as there are
        cores play side by side). After a hit, those skipped before the evaluation that hit;
        after a run that used its budget without a hit, all it kept: so the time to target is
        the one an evaluation every eval.every updates would have found, not the evaluator's
        pace. Each is logged with its own update, frames and wall time, after the run's rows:
        /eval is in logged order, which `analysis` sorts by update. Those left unplayed (a stop
        signal, a worker that died) stay in checkpoints/unplayed.npz."""
        if self._target_reached:
            owed, why = self._gap, "target reached; evaluating the weights skipped before the " \
                "ones that reached it"
        elif on_budget:  # without a target nothing is kept: the lists are empty
            owed, why = [*self._gap, *self._skipped], "target not reached; evaluating the " \
                "weights the evaluator had no time for"
        else:
            return
        if not owed:
            return
        workers = [self.evaluator, *self.evaluator.siblings(len(owed) - 1)]
        say(f"[ddrl] {why} ({len(owed)}, updates {owed[0].update}-{owed[-1].update}), oldest "
            f"first, until one reaches it; {len(workers)} evaluator process(es)")
        left = self._play_in_order(owed, workers, stop)
        for worker in workers[1:]:
            worker.cancel()
        if len(left) < len(owed):  # else the final checkpoint's unplayed.npz holds them all
            checkpoint.save_unplayed(self.run_dir / "checkpoints", self._as_checkpoints(left))

    def _play_in_order(self, owed: list[Snapshot], workers: list[BackgroundEvaluator],
                       stop: threading.Event) -> list[Snapshot]:
        """`owed` played in order on `workers`, each starting the next when free, until the
        earliest to reach the target is known: all before it played, none after it started
        (those after it still playing are abandoned). Those still owed: unplayed before the
        first hit (a stop, a worker that died)."""
        playing: dict[int, BackgroundEvaluator] = {}
        logged: set[int] = set()
        hit, upcoming = len(owed), 0  # hit: the earliest index known to reach the target
        while not stop.is_set():
            for worker in workers:
                if not worker.busy and upcoming < hit:
                    worker.start(owed[upcoming])
                    playing[upcoming] = worker
                    upcoming += 1
            if not playing:
                break
            progressed = False
            for i, worker in list(playing.items()):
                done = worker.poll()
                if done is None and worker.busy:
                    continue
                del playing[i]
                progressed = True
                if done is None:  # its worker died (a warning said so): none starts after it
                    upcoming = len(owed)
                    continue
                if i < hit:
                    self._log_eval(done)
                    logged.add(i)
                    confirm = self._confirmation(done)
                    if confirm is not None:  # the same worker plays the rest of the games
                        worker.start(confirm)
                        playing[i] = worker
                    elif done.result.mean >= self.cfg.eval.target:
                        hit = i
            for i in [i for i in playing if i > hit]:
                playing.pop(i).cancel()
            if not progressed:
                time.sleep(0.05)
        for worker in playing.values():
            worker.cancel()
        return [snap for i, snap in enumerate(owed[:hit]) if i not in logged]

    def _as_checkpoints(self, snaps: list[Snapshot]) -> list[checkpoint.Checkpoint]:
        return [checkpoint.Checkpoint(s.update, s.frames, s.wall_time, self.counters.restarts,
                                      s.weights, []) for s in snaps]

    def _log_eval(self, done: EvalDone) -> None:
        res = done.result
        self.log.append("eval", {"update": done.update, "frames": done.frames,
                                 "wall_time": done.wall_time, "mean_return": res.mean,
                                 "std_return": res.std, "max_return": res.max,
                                 "episodes": res.episodes, "seconds": done.seconds,
                                 "cpu_seconds": done.cpu_seconds})
        if done.update >= self._eval_mark:  # not a backfilled one: the newest score
            self.progress.eval_score = res.mean
        if self._best is None or res.mean > self._best:
            self._best = res.mean
            checkpoint.save_best(self.run_dir / "checkpoints", checkpoint.Checkpoint(
                done.update, done.frames, done.wall_time, self.counters.restarts, done.weights,
                [], res.mean))
        target = self.cfg.eval.target
        if target is not None and res.mean >= target and self._confirmation(done) is None \
                and not self._target_reached:
            self._target_reached = True
            now = time.perf_counter() - self._t_origin
            say(f"[ddrl] target {target:g} reached: the weights of update {done.update} "
                f"({done.frames:,} frames, {_clock(done.wall_time)}) scored {res.mean:.1f} over "
                f"{res.episodes} games; known at {_clock(now)}, "
                f"{max(now - done.wall_time, 0.0):.0f} s after they were taken")

    def _log_rows(self, tables: dict[str, list[dict[str, float]]]) -> None:
        """A sync backend's or the actors' own telemetry, stamped with this update."""
        for table, rows in tables.items():
            for row in rows:
                self.log.append(table, {"update": self.counters.update,
                                        "wall_time": self.counters.wall_time, **row})

    def _checkpoint(self, background: bool = False) -> Path | None:
        """The new checkpoint (None when written in the background); None also when the
        weights are no longer finite, so that a diverged run never rotates its good
        checkpoints out."""
        self._wait_for_writer()
        # Rows up to the checkpoint must be on disk first (fsynced, as the checkpoint is): a
        # resume keeps exactly those.
        self.log.flush(sync=True)
        self._apply(self.sync.pull_state())
        c = self.counters
        weights = self.learner.get_weights()
        if not np.isfinite(weights).all():
            return None
        # The copies are taken here, between updates; the writer only writes them.
        args = (self.run_dir / "checkpoints", checkpoint.Checkpoint(
            c.update, c.frames, c.wall_time, c.restarts, weights,
            [a.copy() for a in self.learner.get_optimizer_state()]),
            self.cfg.run.keep_checkpoints, self._as_checkpoints(self._unplayed()))
        if background:
            self._writing = self._writer.submit(_save, *args)
            return None
        return _save(*args)

    def _wait_for_writer(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _finish(self, reason: str, signalled: threading.Event) -> int:
        # First: a backend may wait for the other ranks' last exchange (at most sync.timeout).
        final = self.sync.finish()
        if final is not None:
            self._apply(final.update)
            if self.world.is_root:
                self._log_rows(final.rows)
        self.actors.close()
        # The weights first, before anything long (a replay memory's gigabytes, the final
        # evaluation): a full disk or the batch system's kill then costs the rest, not them.
        path = self._checkpoint() if self.world.is_root else None
        self._writer.shutdown()
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
        self.world.barrier()
        return code

    def _finish_root(self, reason: str, signalled: threading.Event, path: Path | None) -> bool:
        """Rank 0's end of the run after its last checkpoint (`path`): evaluations, the log
        closed. False when a stop signal cut them short: the owed ones, the final one."""
        c = self.counters
        if reason != "signal":
            self._poll_eval(wait=True, stop=signalled)
            self._play_owed(signalled, on_budget=reason in ("frames", "time"))
        if self.evaluator is not None:
            self.evaluator.cancel()
        complete = reason == "signal" or not signalled.is_set()
        final = reason in ("frames", "time") and self.cfg.eval.episodes
        if complete and final:
            # A run that ends on its budget gets a score for its last weights.
            say(f"[ddrl] final evaluation: {self.cfg.eval.episodes} games with the weights of "
                f"update {c.update}")
            # Played here, on rank 0's own threads: the process's CPU time is the evaluation's,
            # the ranks having stopped.
            wall, cpu = time.monotonic(), time.process_time()
            res = evaluate(self.cfg, self.learner, self.cfg.eval.episodes,
                           derive_seed(self.cfg.run.seed, 0, f"final-eval/{c.update}"), signalled)
            complete = res is not None
            if complete:
                self._log_eval(EvalDone(c.update, c.frames, c.wall_time, res,
                                        self.learner.get_weights(), time.monotonic() - wall,
                                        time.process_time() - cpu))
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
