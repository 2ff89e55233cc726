"""The update loop every rank runs: batch -> gradients -> sync -> update, with rank 0 also
logging, evaluating and checkpointing.

Control decisions travel in the gradient collective's side channel (`side_channel`), so all
ranks stop after the same update for the same reason.
"""
from __future__ import annotations

import hashlib
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddrl import checkpoint
from ddrl.config import Config
from ddrl.distributed.schema import Schema
from ddrl.distributed.sync import Sync
from ddrl.distributed.world import World
from ddrl.evaluate import BackgroundEvaluator, evaluate
from ddrl.log import RunLog
from ddrl.node.base import Node
from ddrl.node.learner import Learner
from ddrl.output import say
from ddrl.progress import Progress
from ddrl.seeding import derive_seed

RANK_FIELDS = ("frames", "dp_per_s", "t_compute", "t_sync", "t_sim", "t_predict")
ROOT_STOPS = ("", "target", "time")
EXIT_SIGNALLED = 3
EXIT_NONFINITE = 5
# Updates in a row whose gradient held NaN or Inf before the run gives up: one can be a
# freak batch, a streak means the optimisation has diverged.
NONFINITE_LIMIT = 10


def side_channel(ranks: int) -> Schema:
    """Summed over the ranks with the gradient: how many ranks received a stop signal, rank
    0's stop code (an index into ROOT_STOPS), the frames simulated, and each rank's figures
    (RANK_FIELDS) in a block of its own."""
    return Schema("signalled", "stop", "frames", ("ranks", len(RANK_FIELDS) * ranks),
                  dtype=np.float32)


@dataclass
class Counters:
    update: int = 0
    frames: int = 0
    wall_time: float = 0.0
    restarts: int = 0


class Trainer:
    def __init__(self, cfg: Config, world: World, learner: Learner, node: Node, sync: Sync,
                 run_dir: Path, counters: Counters, log: RunLog | None,
                 evaluator: BackgroundEvaluator | None):
        self.cfg, self.world, self.learner, self.node, self.sync = cfg, world, learner, node, sync
        self.run_dir = run_dir
        self.c = counters
        self.log = log
        self.evaluator = evaluator
        self.progress = Progress(cfg.run.progress_seconds, cfg.run.max_frames, cfg.run.max_minutes,
                                 start_frames=counters.frames)
        self._slow = world.rank in cfg.debug.slow_ranks and cfg.debug.slow_factor > 1
        self._freeze_at = cfg.debug.freeze_update if world.rank == cfg.debug.freeze_rank else None
        self._target_reached = False
        self._best = checkpoint.best_score(run_dir / "checkpoints") if world.is_root else None
        self._side = side_channel(world.size)
        # Periodic checkpoints are written off the training thread (a large net's .npz takes
        # seconds on a slow shared filesystem); one at a time, and a failed write surfaces at
        # the next checkpoint or at the end.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ddrl-checkpoint")
        self._writing: Future | None = None

    def _extras(self, signalled: bool, frames: int, figures: list[float]) -> np.ndarray:
        extras = self._side.pack(signalled=float(signalled), frames=frames)
        if self.world.is_root:
            self._side.set(extras, "stop", ROOT_STOPS.index(self._root_stop()))
        start = len(RANK_FIELDS) * self.world.rank
        self._side.get(extras, "ranks")[start:start + len(RANK_FIELDS)] = figures
        return extras

    def _root_stop(self) -> str:
        """Rank 0 alone evaluates and keeps the clock; frames are global, so all agree on them."""
        if self._target_reached:
            return "target"
        if self.cfg.run.max_minutes and self.c.wall_time >= self.cfg.run.max_minutes * 60:
            return "time"
        return ""

    def run(self) -> int:
        cfg, c = self.cfg, self.c
        fields = len(RANK_FIELDS)
        t_origin = time.perf_counter() - c.wall_time
        last_ckpt = time.monotonic()
        sim0, pred0 = self.node.t_sim, self.node.t_predict
        frames_reported = 0
        window = {"updates": 0, "dp": 0, "t_sync": 0.0, "t_train": 0.0, "nonfinite": 0,
                  "start": c.wall_time}
        last_sync = 0.0
        nonfinite_streak = 0
        with checkpoint.StopSignals() as signals:
            self.node.start(lambda: signals.received is not None)
            while True:
                t0 = time.perf_counter()
                batch = self.node.next_batch()
                t1 = time.perf_counter()
                grad, stats = self.learner.gradients(batch)
                t_train = time.perf_counter() - t1
                if self._slow:
                    time.sleep((cfg.debug.slow_factor - 1) * (time.perf_counter() - t0))
                if c.update == self._freeze_at:
                    os.kill(os.getpid(), signal.SIGSTOP)
                frames_new = self.node.frames - frames_reported
                frames_reported += frames_new
                sim, pred = self.node.t_sim - sim0, self.node.t_predict - pred0
                sim0, pred0 = self.node.t_sim, self.node.t_predict
                step_time = time.perf_counter() - t0 + last_sync
                extras = self._extras(signals.received is not None, frames_new,
                                      [frames_new, len(batch) / max(step_time, 1e-9), t_train,
                                       last_sync, sim, pred])
                res = self.sync.update(self.learner, grad, extras)
                nonfinite_streak = 0 if res.finite else nonfinite_streak + 1
                window["nonfinite"] += not res.finite
                last_sync = res.seconds
                c.update += 1
                self.node.update = c.update
                side = self._side.unpack(res.extras)
                c.frames += int(round(side["frames"]))
                self.learner.schedule(c.frames / cfg.run.max_frames)
                c.wall_time = time.perf_counter() - t_origin
                window["updates"] += 1
                window["dp"] += len(batch) * res.contributors
                window["t_sync"] += res.seconds
                window["t_train"] += t_train
                if self.world.is_root:
                    self._root_bookkeeping(batch, stats, res, window,
                                           side["ranks"].reshape(self.world.size, fields),
                                           sim, pred)
                    if time.monotonic() - last_ckpt >= cfg.run.checkpoint_minutes * 60:
                        self._checkpoint(background=True)
                        last_ckpt = time.monotonic()
                if side["signalled"] > 0:
                    reason = "signal"
                    signals.job_stopping = True
                elif side["stop"] > 0:
                    reason = ROOT_STOPS[int(round(side["stop"]))]
                elif nonfinite_streak >= NONFINITE_LIMIT:
                    reason = "nonfinite"
                elif c.frames >= cfg.run.max_frames:
                    reason = "frames"
                else:
                    continue
                break
        return self._finish(reason)

    def _root_bookkeeping(self, batch, stats, res, window, ranks, sim, pred) -> None:
        cfg, c, log = self.cfg, self.c, self.log
        for ret, length in self.node.pop_episodes():
            # Stamped with the global frame count at this update: the x axis of every curve.
            log.append("episodes", {"rank": 0, "frames": c.frames, "wall_time": c.wall_time,
                                    "return": ret, "length": length})
            self.progress.online.append(ret)
        if c.update % cfg.run.log_every == 0:
            span = max(c.wall_time - window["start"], 1e-9)
            n = window["updates"]
            log.append("train", {
                "update": c.update, "frames": c.frames, "wall_time": c.wall_time,
                **stats, "lr": self.learner.lr, "dp_per_s": window["dp"] / span,
                "contributors": res.contributors, "effective_batch": len(batch) * res.contributors,
                "policy_lag": float(c.update - 1 - batch.acted_at.mean()),
                "dropped": res.dropped, "staleness": res.staleness,
                "nonfinite": window["nonfinite"],
                "t_sim": sim, "t_predict": pred, "t_train": window["t_train"] / n,
                "t_sync": window["t_sync"] / n, "restart": c.restarts})
            # A rank's figures may sum several of its steps since rank 0's previous update.
            reports = np.ones(len(ranks)) if res.reports is None else np.maximum(res.reports, 1)
            contributed = np.ones(len(ranks), int) if res.applied is None else res.applied
            for r, row in enumerate(ranks):
                log.append("ranks", {"update": c.update, "wall_time": c.wall_time, "rank": r,
                                     **dict(zip(RANK_FIELDS, row / reports[r])),
                                     "contributed": contributed[r]})
            self._log_rows(res)
            window.update(updates=0, dp=0, t_sync=0.0, t_train=0.0, nonfinite=0, start=c.wall_time)
        self._poll_eval(wait=False)
        if (self.evaluator is not None and cfg.eval.episodes and c.update % cfg.eval.every == 0
                and not self.evaluator.busy):
            self.evaluator.start(self.learner.get_weights(), c.update, c.frames, c.wall_time)
        self.progress.maybe_print(c.frames, c.wall_time, c.update)

    def _poll_eval(self, wait: bool) -> None:
        if self.evaluator is None:
            return
        done = self.evaluator.poll(wait=wait)
        if done is None:
            return
        self._log_eval(*done)

    def _log_eval(self, update, frames, wall_time, res, weights) -> None:
        self.log.append("eval", {"update": update, "frames": frames, "wall_time": wall_time,
                                 "mean_return": res.mean, "std_return": res.std,
                                 "max_return": res.max, "episodes": res.episodes})
        self.progress.eval_score = res.mean
        if self._best is None or res.mean > self._best:
            self._best = res.mean
            checkpoint.save_best(self.run_dir / "checkpoints", checkpoint.Checkpoint(
                update, frames, wall_time, self.c.restarts, weights, [], res.mean))
        target = self.cfg.eval.target
        if target is not None and res.mean >= target:
            self._target_reached = True

    def _log_rows(self, res) -> None:
        """The sync backend's own telemetry, stamped with this update."""
        for table, rows in res.rows.items():
            for row in rows:
                self.log.append(table, {"update": self.c.update, "wall_time": self.c.wall_time,
                                        **row})

    def _checkpoint(self, background: bool = False) -> Path | None:
        """The new checkpoint (None when written in the background); None also when the
        weights are no longer finite, so that a diverged run never rotates its good
        checkpoints out."""
        self._wait_for_writer()
        # Rows up to the checkpoint must be on disk first: a resume keeps exactly those.
        self.log.flush()
        self.sync.pull_state(self.learner)
        c = self.c
        weights = self.learner.get_weights()
        if not np.isfinite(weights).all():
            return None
        # The copies are taken here, between updates; the writer only writes them.
        args = (self.run_dir / "checkpoints", checkpoint.Checkpoint(
            c.update, c.frames, c.wall_time, c.restarts, weights,
            [a.copy() for a in self.learner.get_optimizer_state()]),
            self.cfg.run.keep_checkpoints)
        if background:
            self._writing = self._writer.submit(checkpoint.save, *args)
            return None
        return checkpoint.save(*args)

    def _wait_for_writer(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _finish(self, reason: str) -> int:
        # First: a backend may wait for the other ranks' last exchange (at most sync.timeout).
        final = self.sync.finish(self.learner)
        if final is not None and self.world.is_root:
            self._log_rows(final)
        self.node.close()
        if reason != "nonfinite":
            # Every rank stops at this update, which the final checkpoint holds.
            self.node.save_state(self.run_dir / "checkpoints", self.c.update)
        code = {"signal": EXIT_SIGNALLED, "nonfinite": EXIT_NONFINITE}.get(reason, 0)
        # One line per rank, so anyone can check that all ranks ended with the same weights.
        digest = hashlib.sha256(self.learner.get_weights().tobytes()).hexdigest()[:16]
        say(f"[ddrl] rank {self.world.rank} final weights sha256 {digest}")
        if self.world.is_root:
            self._finish_root(reason)
        # No rank exits before rank 0 has saved: launchers kill the job when the first exits.
        self.world.barrier()
        return code

    def _finish_root(self, reason: str) -> None:
        c = self.c
        if reason != "signal":
            self._poll_eval(wait=True)
        elif self.evaluator is not None:
            self.evaluator.cancel()
        if reason in ("frames", "time") and self.cfg.eval.episodes:
            # A run that ends on its budget gets a score for its last weights.
            res = evaluate(self.cfg, self.learner, self.cfg.eval.episodes,
                           derive_seed(self.cfg.run.seed, 0, f"final-eval/{c.update}"))
            self._log_eval(c.update, c.frames, c.wall_time, res, self.learner.get_weights())
        path = self._checkpoint()
        self._writer.shutdown()
        self.log.close()
        self.progress.maybe_print(c.frames, c.wall_time, c.update, final=True)
        if reason == "nonfinite":
            good = path or checkpoint.latest(self.run_dir / "checkpoints")
            say(f"ddrl: error: the last {NONFINITE_LIMIT} updates had NaN or Inf gradients, so the "
                f"optimisation diverged (try a lower optim.lr); none of them was applied; last "
                f"good checkpoint: {good or 'none (the weights were never finite at a checkpoint)'}",
                err=True)
            return
        say(f"[ddrl] stopped ({reason}) after {c.update} updates, {c.frames:,} frames; "
            f"log {self.run_dir / 'log.h5'}, checkpoint {path}")
