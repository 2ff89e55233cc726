"""The log's figures mirrored live into Weights & Biases (`run.wandb`, the `wandb` extra): the
same scalars as the TensorBoard files (`ddrl.rundir.tensorboard.points`), with frames as the x axis.

One W&B run per run directory: its id is derived from the directory and the log's start
time, so a resumed run continues the same W&B run (rows after the checkpoint, which the run
plays again, appear twice there; the HDF5 log keeps one copy). Everything W&B configures
for itself applies: `WANDB_MODE=offline` writes it under `RUN_DIR/wandb/` for `wandb sync`
later, `WANDB_API_KEY`, `WANDB_ENTITY`.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from ddrl.config import Config
from ddrl.errors import DdrlError
from ddrl.rundir.tensorboard import points


def check_installed(cfg: Config) -> None:
    """Before anything starts: the project asked for, and nothing to write it with."""
    if cfg.run.wandb and importlib.util.find_spec("wandb") is None:
        raise DdrlError(f"config key run.wandb: {cfg.run.wandb!r} needs Weights & Biases, which "
                        "is not installed: pip install 'ddrl[wandb]', or set run.wandb = ''")


def run_id(run_dir: Path, start_time: str) -> str:
    return hashlib.sha256(f"{run_dir.resolve()}|{start_time}".encode()).hexdigest()[:16]


class WandbWriter:
    def __init__(self, project: str, run_dir: Path, start_time: str, config: dict[str, Any]):
        import wandb

        try:
            self._run = wandb.init(project=project, dir=str(run_dir), name=run_dir.name,
                                   id=run_id(run_dir, start_time), resume="allow",
                                   config=config)
        except Exception as exc:  # W&B raises its own errors (no key, no network, ...)
            raise DdrlError(f"config key run.wandb: Weights & Biases did not start ({exc}); "
                            "WANDB_MODE=offline logs without a server") from None
        self._run.define_metric("frames")
        self._run.define_metric("*", step_metric="frames")

    def write(self, table: str, rows: Any, columns: list[str]) -> None:
        for frames, _, values in points(table, rows, columns):
            self._run.log({"frames": frames, **values})

    def flush(self) -> None:
        """W&B's own process writes and uploads; nothing is held here."""

    def close(self) -> None:
        self._run.finish()
