"""Rank 0's rows in the run's log: episodes, a `/train` row per window with a `/ranks` row per
rank, the backends' and actors' own tables, and evaluations (the best weights kept beside
them). Every row is stamped with the run's counters at the update it belongs to."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ddrl.algos.batch import Batch
from ddrl.distributed.sync import SyncResult
from ddrl.loop.bookkeeping import RANK_FIELDS, Counters, Step
from ddrl.loop.evaluator import EvalDone
from ddrl.loop.progress import Progress
from ddrl.rundir import checkpoint
from ddrl.rundir.log import RunLog


class RootRecords:
    def __init__(self, log: RunLog, counters: Counters, progress: Progress, run_dir: Path):
        self.log, self.counters, self.progress = log, counters, progress
        self._checkpoints = run_dir / "checkpoints"
        self.best = checkpoint.best_score(self._checkpoints)

    def confirmed(self, target: float | None, games: int) -> bool:
        """Whether the log holds an evaluation at `target` over `games` or more, not cut: a
        crossing confirmed (eval.confirm_episodes), as a resumed run finds it."""
        if target is None:
            return False
        rows = self.log.rows("eval")
        return bool(((rows["cut"] == 0) & (rows["mean_return"] >= target)
                     & (rows["episodes"] >= games)).any())

    def highest_mean(self) -> float | None:
        """The highest mean of the log's evaluations, cut ones included: what the run had
        decided eval.focus_above and eval.full_share_above on before a stop. A cut mean is no
        score (`best` keeps none), but the live run focuses on it, and with a target and
        eval.max_return every evaluation below the target is cut."""
        means = self.log.rows("eval")["mean_return"]
        means = means[np.isfinite(means)]
        return float(means.max()) if len(means) else None

    def episodes(self, finished: Iterable[tuple[float, int]]) -> None:
        c = self.counters
        for ret, length in finished:
            # Stamped with the global frame count at this update: the x axis of every curve.
            self.log.append("episodes", {"rank": 0, "frames": c.frames, "wall_time": c.wall_time,
                                         "return": ret, "length": length})
            self.progress.online.append(ret)

    def update(self, batch: Batch, figures: dict[str, float], step: Step, res: SyncResult,
               ranks: np.ndarray) -> None:
        """A `/train` row with the window's `figures` (the loss terms, the rate, the window's
        means), a `/ranks` row per rank (`ranks`: one RANK_FIELDS row each)."""
        c = self.counters
        self.log.append("train", {
            "update": c.update, "frames": c.frames, "wall_time": c.wall_time, **figures,
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
        self.rows(res.rows)

    def rows(self, tables: dict[str, list[dict[str, float]]]) -> None:
        """A sync backend's or the actors' own telemetry, stamped with this update."""
        for table, rows in tables.items():
            for row in rows:
                self.log.append(table, {"update": self.counters.update,
                                        "wall_time": self.counters.wall_time, **row})

    def waits(self, games: int) -> list[float]:
        """The seconds the ranks waited for each evaluation of `games` (eval.episodes) or fewer
        so far, in the order they were charged to eval.pause_share (a confirmation's are not): a
        resumed run's share goes on from them (charged a near miss's follow-up too, which the
        run before the stop was not: the stricter side)."""
        rows = self.log.rows("eval")
        return [float(h) for h, n in zip(rows["held"], rows["episodes"]) if h > 0 and n <= games]

    def evaluation(self, done: EvalDone, newest: bool, known_at: float, held: float) -> None:
        """An `/eval` row (`held`: the seconds the ranks waited for it); the best weights so
        far saved beside the checkpoints."""
        res = done.result
        self.log.append("eval", {"update": done.update, "frames": done.frames,
                                 "wall_time": done.wall_time, "mean_return": res.mean,
                                 "std_return": res.std, "max_return": res.max,
                                 "episodes": res.episodes, "seconds": done.seconds,
                                 "cpu_seconds": done.cpu_seconds, "cut": res.cut,
                                 "known_at": known_at, "longest": res.longest, "held": held})
        if newest:
            self.progress.eval_score, self.progress.eval_cut = res.mean, res.cut
        if res.cut:  # no score: below the target, and no more
            return
        if self.best is None or res.mean > self.best:
            self.best = res.mean
            checkpoint.save_best(self._checkpoints, checkpoint.Checkpoint(
                done.update, done.frames, done.wall_time, self.counters.restarts, done.weights,
                [], res.mean))
