"""Rank 0's checkpoints during and at the end of a run: when they fall due, and their writes,
periodic ones off the training thread (a large net's .npz takes seconds on a slow shared
filesystem), one at a time; a failed write surfaces at the next checkpoint or at the end."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ddrl import checkpoint
from ddrl.loop.evaluator import Snapshot


def _save(directory: Path, ckpt: checkpoint.Checkpoint, keep: int,
          unplayed: list[checkpoint.Checkpoint]) -> Path:
    # The unplayed weights first: a stop between the two leaves some newer than the checkpoint,
    # which a resume drops, rather than the checkpoint without its newest unplayed.
    checkpoint.save_unplayed(directory, unplayed)
    return checkpoint.save(directory, ckpt, keep)


class CheckpointWriter:
    """`restarts`: the run's, which its weights still to evaluate are saved with."""

    def __init__(self, directory: Path, keep: int, minutes: float, restarts: int):
        self.directory, self._keep, self._every = directory, keep, minutes * 60
        self._restarts = restarts
        self._last = time.monotonic()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ddrl-checkpoint")
        self._writing: Future | None = None

    def due(self) -> bool:
        """Once per checkpoint period: True, and the period starts again."""
        if time.monotonic() - self._last < self._every:
            return False
        self._last = time.monotonic()
        return True

    def wait(self) -> None:
        """The write in progress is done; its error, if it failed, raised here."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def write(self, ckpt: checkpoint.Checkpoint, unplayed: list[Snapshot],
              background: bool = False) -> Path | None:
        """The checkpoint and the weights still to evaluate; the checkpoint's path, None when
        written in the background. The arrays must be copies the caller no longer changes: the
        writer only writes them."""
        self.wait()
        args = (self.directory, ckpt, self._keep, self._as_checkpoints(unplayed))
        if background:
            self._writing = self._writer.submit(_save, *args)
            return None
        return _save(*args)

    def save_unplayed(self, snaps: list[Snapshot]) -> None:
        checkpoint.save_unplayed(self.directory, self._as_checkpoints(snaps))

    def _as_checkpoints(self, snaps: list[Snapshot]) -> list[checkpoint.Checkpoint]:
        return [checkpoint.Checkpoint(s.update, s.frames, s.wall_time, self._restarts,
                                      s.weights, []) for s in snaps]

    def close(self) -> None:
        self._writer.shutdown()
