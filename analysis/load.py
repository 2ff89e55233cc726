"""Load run logs into pandas: one `Run` per run directory (or `log.h5` file).

Logs are always opened in SWMR-read mode, because that is the only way h5py can open a log
whose writer is still running or was killed; the file is closed again right after reading,
so analysis never holds a lock that a resuming job would trip over.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import h5py
import numpy as np
import pandas as pd

from ddrl.config import Config, current_keys
from ddrl.errors import DdrlError
from ddrl.rundir.log import TABLES, open_log, read_table

LOG_NAME = "log.h5"


class Progress(NamedTuple):
    updates: int
    frames: int
    wall_time: float


@dataclass
class Run:
    """One run's log: resolved config, root attributes and one DataFrame per table."""

    path: Path
    name: str
    config: dict[str, Any]
    attrs: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def __getitem__(self, table: str) -> pd.DataFrame:
        return self.tables[table]

    def setting(self, key: str, default: Any = None) -> Any:
        """A config value by its dotted key, e.g. `run.setting("acting.batch_size")`."""
        return current_keys(_flat(self.config)).get(key, default)

    def flat_config(self) -> dict[str, Any]:
        """`section.key -> value`, plus `ranks` (the world size), for comparing runs.

        A key the log lacks takes today's default: a log written before the key existed ran
        with the behaviour its default keeps (the keys that can be none, eval.target and
        eval.max_return, default to none), so an old run and a new one differ only where their settings do."""
        flat = {**_DEFAULTS, **current_keys(_flat(self.config))}
        flat["ranks"] = self.world_size
        return flat

    def progress(self) -> Progress:
        """How far the run got: the largest values in the global tables, since the last
        /train row can trail the latest episode or evaluation by up to `run.log_every`.
        (/ranks counts each rank's own frames, so it says nothing about the total.)"""
        tables = [self.tables[t] for t in ("train", "episodes", "eval") if len(self.tables[t])]
        return Progress(
            updates=int(max((t["update"].max() for t in tables if "update" in t), default=0)),
            frames=int(max((t["frames"].max() for t in tables), default=0)),
            wall_time=float(max((t["wall_time"].max() for t in tables), default=0.0)))

    @property
    def world_size(self) -> int:
        return int(self.attrs.get("world_size", 1))

    @property
    def workers(self) -> int:
        """Ranks that compute gradients, virtual ones included: parameter-server ranks only
        serve weights."""
        if self.setting("sync.mode") == "ps":
            return self.world_size - int(self.setting("sync.ps", 0))
        return self.world_size * int(self.setting("sync.virtual_ranks", 1))

    @property
    def effective_batch(self) -> int:
        """Data points per update with every worker's gradient aggregated (the paper's n x bs):
        from the log's first /train row (a PPO update is one minibatch); from the config for
        a run that logged no update yet."""
        train = self.tables.get("train")
        if train is not None and len(train):
            first = train.iloc[0]
            return self.workers * int(round(first["effective_batch"] / max(first["contributors"], 1)))
        if self.setting("acting.mode") == "a2c":
            per_rank = int(self.setting("acting.n_sim", 1)) * int(self.setting("acting.t_max", 1))
        else:
            per_rank = int(self.setting("acting.batch_size", 1))
        return self.workers * per_rank

    @property
    def game(self) -> str:
        """`ALE/Breakout-v5` -> `Breakout`; `CartPole-v1` -> `CartPole`."""
        env_id = str(self.setting("env.id", "?"))
        return env_id.split("/")[-1].split("-v")[0]


def _flat(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {f"{sec}.{k}": v for sec, body in config.items() for k, v in body.items()}


_DEFAULTS = _flat(Config().to_dict())


def find_log(path: str | Path) -> Path:
    """The log file of a run directory, or the path itself when it names a file."""
    path = Path(path)
    if path.is_dir():
        path = path / LOG_NAME
        if not path.is_file():
            raise DdrlError(f"{path.parent}: no {LOG_NAME} here (not a run directory?)")
        return path
    if not path.exists():
        raise DdrlError(f"{path}: no such run directory or log file")
    return path


def _run_name(log: Path) -> str:
    return log.parent.name if log.name == LOG_NAME else log.stem


def _attr(value: Any) -> Any:
    """Root attributes come back as numpy scalars or bytes; JSON ones are decoded."""
    if isinstance(value, bytes):
        value = value.decode()
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run directory or log file, also while its job is still writing it."""
    log = find_log(path)
    if not h5py.is_hdf5(log):
        raise DdrlError(f"{log}: not an HDF5 file")
    try:
        f = open_log(log)
    except OSError as exc:
        raise DdrlError(f"{log}: cannot open the log ({str(exc).splitlines()[0]})") from None
    with f:
        attrs = {k: _attr(v) for k, v in f.attrs.items()}
        if not isinstance(attrs.get("config"), dict):
            raise DdrlError(f"{log}: not a ddrl run log (no JSON 'config' attribute)")
        # A log of an older format version may lack a table: it reads as empty.
        tables = {t: pd.DataFrame(read_table(f, t)) if t in f
                  else pd.DataFrame(columns=[c for c, *_ in TABLES[t]]) for t in TABLES}
    # Evaluations of skipped weights are played after the one that hit the target (the
    # trainer's backfill): in the order of the weights, the first row reaching it is the first.
    evals = tables["eval"].sort_values("update", kind="stable", ignore_index=True)
    # Evaluations stopped once the target was out of reach are no scores (their games are the
    # first to end): kept apart, for what they cost.
    cut = evals["cut"].to_numpy(bool) if "cut" in evals else np.zeros(len(evals), bool)
    tables["eval"] = evals[~cut].reset_index(drop=True)
    tables["eval_cut"] = evals[cut].reset_index(drop=True)
    return Run(path=log, name=name or _run_name(log), config=attrs.pop("config"),
               attrs=attrs, tables=tables)


def run_names(paths: Iterable[str | Path]) -> list[str]:
    """Names for several runs: their directory names, or where two collide (each sweep's
    `seed_0`), for all of them the fewest trailing parts of their directories' paths that
    tell them apart (`sweep-a/seed_0`, `sweep-b/seed_0`)."""
    logs = [find_log(p) for p in paths]
    names = [_run_name(log) for log in logs]
    # abspath: the names the user gave (no symlink resolved, no filesystem call).
    dirs = [Path(os.path.abspath(log)).parent.parts for log in logs]
    for depth in range(2, max(map(len, dirs), default=0) + 1):
        if len(set(names)) == len(names):
            break
        names = [str(Path(*d[-depth:])) for d in dirs]
    return names


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Several runs, named by `run_names`."""
    paths = list(paths)
    return [load_run(p, name=n) for p, n in zip(paths, run_names(paths))]

