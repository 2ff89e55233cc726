"""Rank 0's checkpoints during and at the end of a run: when they fall due, and their writes,
periodic ones off the training thread (a large net's .npz takes seconds on a slow shared
filesystem), one at a time. A write that fails with an error that may pass (an NFS
fail-over) is tried once more; a periodic one that still fails is reported at once and the
run trains on from the last good checkpoint, the next period tries again; a second failure
in a row, the final checkpoint's, or a full disk ends the run."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ddrl.config import RunConfig
from ddrl.errors import StorageFaultError
from ddrl.loop.evaluator import Snapshot
from ddrl.output import say
from ddrl.rundir import checkpoint


class CheckpointWriter:
    """`restarts`: the run's, which its weights still to evaluate are saved with."""

    def __init__(self, directory: Path, run: RunConfig, restarts: int):
        self.directory, self._keep, self._every = directory, run.keep_checkpoints, \
            run.checkpoint_minutes * 60
        self._restarts, self._retry_seconds = restarts, run.storage_retry_seconds
        self._last = time.monotonic()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ddrl-checkpoint")
        self._writing: Future | None = None
        self._failed = 0  # periodic writes failed in a row

    def due(self) -> bool:
        """Once per checkpoint period: True, and the period starts again. A periodic write
        that has failed meanwhile is reported here, at the update after it."""
        if self._writing is not None and self._writing.done():
            self.wait()
        if time.monotonic() - self._last < self._every:
            return False
        self._last = time.monotonic()
        return True

    def wait(self) -> None:
        """The write in progress is done. A failure that may pass is a warning the first time
        (the last good checkpoint stays), raised the second time in a row; a full or
        read-only disk is raised at once."""
        if self._writing is None:
            return
        writing, self._writing = self._writing, None
        try:
            writing.result()
            self._failed = 0
        except StorageFaultError as exc:
            self._failed += 1
            if self._failed > 1:
                raise
            good = checkpoint.latest(self.directory)
            say(f"ddrl: warning: {exc}; training goes on from the last good checkpoint "
                f"({good.name if good else 'none yet'}), the next is tried in "
                f"{self._every / 60:g} min", err=True)

    def _save(self, ckpt: checkpoint.Checkpoint, unplayed: list[checkpoint.Checkpoint]) -> Path:
        try:
            return self._save_once(ckpt, unplayed)
        except StorageFaultError as exc:
            say(f"ddrl: warning: {exc.reason}; trying again in "
                f"{self._retry_seconds:g} s", err=True)
        time.sleep(self._retry_seconds)
        return self._save_once(ckpt, unplayed)

    def _save_once(self, ckpt: checkpoint.Checkpoint,
                   unplayed: list[checkpoint.Checkpoint]) -> Path:
        # The unplayed weights first: a stop between the two leaves some newer than the
        # checkpoint, which a resume drops, rather than the checkpoint without its newest
        # unplayed.
        checkpoint.save_unplayed(self.directory, unplayed)
        return checkpoint.save(self.directory, ckpt, self._keep)

    def write(self, ckpt: checkpoint.Checkpoint, unplayed: list[Snapshot],
              background: bool = False) -> Path | None:
        """The checkpoint and the weights still to evaluate; the checkpoint's path, None when
        written in the background. The arrays must be copies the caller no longer changes: the
        writer only writes them."""
        self.wait()
        args = (ckpt, self._as_checkpoints(unplayed))
        if background:
            self._writing = self._writer.submit(self._save, *args)
            return None
        return self._save(*args)

    def save_unplayed(self, snaps: list[Snapshot]) -> None:
        checkpoint.save_unplayed(self.directory, self._as_checkpoints(snaps))

    def _as_checkpoints(self, snaps: list[Snapshot]) -> list[checkpoint.Checkpoint]:
        return [checkpoint.Checkpoint(s.update, s.frames, s.wall_time, self._restarts,
                                      s.weights, []) for s in snaps]

    def close(self) -> None:
        self._writer.shutdown()
