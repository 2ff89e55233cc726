"""Live TensorBoard event files beside the log, read back with TensorBoard's own reader."""
from __future__ import annotations

import math

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddrl.rundir.log import RunLog
from ddrl.rundir.tensorboard import EventWriter, start_timestamp

START = "2026-11-25T10:00:00+00:00"


def train_row(update: int, loss: float) -> dict:
    return {"update": update, "frames": 1000 * update, "wall_time": 2.0 * update, "loss": loss,
            "approx_kl": math.nan, "lr": 1e-3}


def board(directory) -> EventAccumulator:
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return acc


def test_each_flush_of_the_log_reaches_the_event_file_with_steps_and_clock(tmp_path):
    log = RunLog.create(tmp_path / "log.h5", {"config": "{}", "start_time": START})
    log.mirrors.append(EventWriter(tmp_path / "tb", start_timestamp(START)))
    for u in range(1, 6):
        log.append("train", train_row(u, loss=0.5 * u))
    log.append("eval", {"update": 5, "frames": 5000, "wall_time": 10.0, "mean_return": 18.5,
                        "std_return": 1.0, "max_return": 21.0, "episodes": 10})
    log.flush()
    # Read while the run goes on: the flush put it on disk.
    acc = board(tmp_path / "tb")
    loss = acc.Scalars("train/loss")
    assert [p.step for p in loss] == [1000, 2000, 3000, 4000, 5000]
    np.testing.assert_allclose([p.value for p in loss], [0.5, 1.0, 1.5, 2.0, 2.5])
    assert loss[0].wall_time == start_timestamp(START) + 2.0
    tags = set(acc.Tags()["scalars"])
    assert {"train/lr", "eval/mean_return", "eval/max_return"} <= tags
    # Bookkeeping columns are axes, not charts; a NaN figure is left out, not drawn as NaN.
    assert not tags & {"train/update", "train/frames", "train/wall_time", "train/approx_kl",
                       "eval/episodes"}
    log.close()


def test_a_resumed_run_replaces_what_came_after_its_checkpoint(tmp_path):
    """The first writer got to update 8 before the crash; the checkpoint was at update 5
    (5,000 frames). The resumed run's new event file drops 6-8 and goes on from 6."""
    first = EventWriter(tmp_path / "tb", 0.0)
    rows = [train_row(u, loss=1.0) for u in range(1, 9)]
    table = np.array([(r["frames"], r["wall_time"], r["loss"]) for r in rows],
                     dtype=[("frames", "i8"), ("wall_time", "f8"), ("loss", "f4")])
    first.write("train", table, list(table.dtype.names))
    first.close()
    resumed = EventWriter(tmp_path / "tb", 0.0)
    resumed.restart(5000 + 1)
    again = table[5:].copy()
    again["loss"] = 2.0
    resumed.write("train", again, list(again.dtype.names))
    resumed.close()
    loss = board(tmp_path / "tb").Scalars("train/loss")
    assert [p.step for p in loss] == [1000 * u for u in range(1, 9)]
    assert [p.value for p in loss] == [1.0] * 5 + [2.0] * 3
