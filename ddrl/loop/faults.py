"""Faults injected on purpose (`debug.*`): the stragglers benchmark slows a rank, the fault
tests freeze one. Nothing here runs unless a job asks for it."""
from __future__ import annotations

import time

from ddrl.config import Config
from ddrl.signals import freeze


class Faults:
    def __init__(self, cfg: Config, rank: int):
        d = cfg.debug
        self._slow_factor = d.slow_factor if rank in d.slow_ranks and d.slow_factor > 1 else 1.0
        self._freeze_at = d.freeze_update if rank == d.freeze_rank else None

    def at_end(self) -> None:
        """`debug.freeze_update = -2`: frozen after the last update, before the final barrier."""
        if self._freeze_at == -2:
            freeze()

    def after_gradients(self, update: int, seconds: float) -> None:
        """`seconds`: this update's batch and gradients, stretched `slow_factor` times."""
        if self._slow_factor > 1:
            time.sleep((self._slow_factor - 1) * seconds)
        if update == self._freeze_at:
            freeze()


# The start-up's stages a rank can be frozen before (`debug.freeze_update`).
BEFORE_MPI, BEFORE_PLACEMENT, BEFORE_WEIGHTS = -4, -3, -1


def freeze_at_startup(cfg: Config, rank: int, stage: int) -> None:
    """`freeze_rank` stops itself at the start-up `stage` its `debug.freeze_update` names (for
    `debug.freeze_seconds`, or for ever): BEFORE_MPI, BEFORE_PLACEMENT (central mode's split
    of the world) or BEFORE_WEIGHTS (after TensorFlow's import, before the initial weights are
    shared)."""
    if rank == cfg.debug.freeze_rank and cfg.debug.freeze_update == stage:
        freeze(cfg.debug.freeze_seconds)
