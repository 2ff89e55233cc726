"""The training loop's state between updates, as named types: the run's counters, the figures
of one update, the log window, and the side channel that carries control to every rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddrl.distributed.schema import Schema

# Each rank's own figures, summed in its block of the side channel: the `/ranks` columns.
RANK_FIELDS = ("frames", "dp_per_s", "t_compute", "t_sync", "t_sim", "t_predict", "peak_rss_mb")
# Rank 0's stop decisions, by index in the side channel ("" goes on).
ROOT_STOPS = ("", "target", "time")
# Updates in a row whose gradient held NaN or Inf before the run gives up: one can be a
# freak batch, a streak means the optimisation has diverged.
NONFINITE_LIMIT = 10


def side_channel(ranks: int) -> Schema:
    """Summed over the ranks with the gradient: how many ranks received a stop signal, rank
    0's stop code (an index into ROOT_STOPS), whether rank 0 asks all to pause while it
    confirms a crossing of the target, the frames simulated, and each rank's figures
    (RANK_FIELDS) in a block of its own."""
    return Schema("signalled", "stop", "pause", "frames", ("ranks", len(RANK_FIELDS) * ranks),
                  dtype=np.float32)


@dataclass
class Counters:
    """What a checkpoint keeps of the run's progress; a resume starts from it."""
    update: int = 0
    frames: int = 0
    wall_time: float = 0.0
    restarts: int = 0


@dataclass
class Step:
    """One update's figures on this rank, before the sync."""
    batch_size: int
    frames: int
    t_train: float
    t_sim: float
    t_predict: float
    # The rank's whole step: batch, gradients and the previous update's sync.
    seconds: float
    t_sync_before: float
    # The process's peak resident memory so far (MiB).
    peak_rss_mb: float = 0.0

    def rank_figures(self) -> list[float]:
        """This rank's block of the side channel, in RANK_FIELDS order."""
        return [self.frames, self.batch_size / max(self.seconds, 1e-9), self.t_train,
                self.t_sync_before, self.t_sim, self.t_predict, self.peak_rss_mb]


class ActorTally:
    """Turns the actors' cumulative counters into each update's share of them."""

    def __init__(self, actors):
        self._actors = actors
        self._frames, self._sim, self._predict = 0, actors.t_sim, actors.t_predict

    def take(self) -> tuple[int, float, float]:
        """(frames, simulator seconds, predictor seconds) since the previous call."""
        a = self._actors
        out = a.frames - self._frames, a.t_sim - self._sim, a.t_predict - self._predict
        self._frames, self._sim, self._predict = a.frames, a.t_sim, a.t_predict
        return out


@dataclass
class Window:
    """Sums since the last `/train` row."""
    start: float
    updates: int = 0
    data_points: int = 0
    t_sync: float = 0.0
    t_train: float = 0.0
    nonfinite: int = 0

    def add(self, step: Step, contributors: int, t_sync: float, finite: bool) -> None:
        self.updates += 1
        self.data_points += step.batch_size * contributors
        self.t_sync += t_sync
        self.t_train += step.t_train
        self.nonfinite += not finite

    def row(self, wall_time: float) -> dict[str, float]:
        """The window's columns of a `/train` row."""
        n = max(self.updates, 1)
        return {"dp_per_s": self.data_points / max(wall_time - self.start, 1e-9),
                "nonfinite": self.nonfinite, "t_train": self.t_train / n, "t_sync": self.t_sync / n}


def stop_reason(side: dict[str, np.ndarray], nonfinite_streak: int, frames: int,
                max_frames: int) -> str | None:
    """Why every rank stops after this update (they all see the same sums), or None."""
    if side["signalled"] > 0:
        return "signal"
    if side["stop"] > 0:
        return ROOT_STOPS[int(round(float(side["stop"])))]
    if nonfinite_streak >= NONFINITE_LIMIT:
        return "nonfinite"
    if frames >= max_frames:
        return "frames"
    return None
