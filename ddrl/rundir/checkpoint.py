"""Checkpoints: weights, Adam state and counters, written atomically.

A checkpoint is one .npz written to a temporary name, fsynced, then renamed, so a kill at any
moment leaves either the previous checkpoint or the new one, never a torn file.
"""
from __future__ import annotations

import contextlib
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddrl.errors import DdrlError, storage_error

PREFIX = "ckpt-"
# The weights of the best greedy evaluation so far: training goes on while the evaluator plays,
# so the last checkpoint can be worse than the policy that reached eval.target.
BEST = "best.npz"
# The weights due for evaluation that the evaluator had not played at the last checkpoint:
# a resumed run plays them once its target is hit, as the stopped run would have.
UNPLAYED = "unplayed.npz"


@dataclass
class Checkpoint:
    update: int
    frames: int
    wall_time: float
    restarts: int
    weights: np.ndarray
    optimizer: list[np.ndarray]
    score: float | None = None


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """One .npz, atomically: written to a temporary name, fsynced, renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    try:
        # np.savez leaves its ZipFile open when a write fails; collected after the file is
        # closed, it tries to finish the archive and prints a traceback. Here the archive is
        # closed, or fails to close, inside this try.
        with open(tmp, "wb") as fh:
            with zipfile.ZipFile(fh, "w", allowZip64=True) as archive:
                for name, array in arrays.items():
                    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, np.asanyarray(array),
                                                  allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        # A full disk: no gigabytes of a half-written file left behind; the files written
        # before stay as they were.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise storage_error(f"{path}: writing failed ({exc.strerror or exc}); the files "
                            "written before it are intact", exc.errno) from None


def read_arrays(path: Path, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz (`names`, or all), each read only if asked for; a damaged or
    foreign file is one DdrlError naming it."""
    if not path.is_file():
        raise DdrlError(f"checkpoint not found: {path}")
    try:
        with np.load(path) as data:
            return {name: data[name] for name in (data.files if names is None else names)}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise DdrlError(f"checkpoint {path} is damaged or not a ddrl checkpoint ({exc})") from None


def _write(path: Path, ckpt: Checkpoint) -> None:
    meta = {"update": ckpt.update, "frames": ckpt.frames, "wall_time": ckpt.wall_time,
            "restarts": ckpt.restarts, "optimizer_arrays": len(ckpt.optimizer),
            "score": ckpt.score}
    write_arrays(path, {"meta": np.array(json.dumps(meta)), "weights": ckpt.weights,
                        **{f"opt{i}": a for i, a in enumerate(ckpt.optimizer)}})


def save(directory: Path, ckpt: Checkpoint, keep: int) -> Path:
    path = directory / f"{PREFIX}{ckpt.update:010d}.npz"
    _write(path, ckpt)
    for old in sorted(directory.glob(f"{PREFIX}*.npz"))[:-keep]:
        old.unlink()
    return path


def save_best(directory: Path, ckpt: Checkpoint) -> Path:
    """Weights only (no optimizer state: it is for evaluation, not for resuming)."""
    path = directory / BEST
    _write(path, ckpt)
    return path


def save_unplayed(directory: Path, snaps: list[Checkpoint]) -> None:
    """Their weights and counters (no optimizer state), or no file when there are none."""
    path = directory / UNPLAYED
    if not snaps:
        path.unlink(missing_ok=True)
        return
    write_arrays(path, {"weights": np.stack([s.weights for s in snaps]),
                        "update": np.array([s.update for s in snaps], np.int64),
                        "frames": np.array([s.frames for s in snaps], np.int64),
                        "wall_time": np.array([s.wall_time for s in snaps], np.float64)})


def load_unplayed(directory: Path, up_to: int) -> list[Checkpoint]:
    """Those taken at or before update `up_to`, the checkpoint resumed from: a resume from an
    older checkpoint (the newest damaged) trains again past the others."""
    path = directory / UNPLAYED
    if not path.is_file():
        return []
    data = read_arrays(path)
    return [Checkpoint(int(u), int(f), float(t), 0, w, [])
            for w, u, f, t in zip(data["weights"], data["update"], data["frames"],
                                  data["wall_time"]) if u <= up_to]


def unplayed_count(directory: Path) -> int:
    """How many weights are owed an evaluation, read without their weights."""
    path = directory / UNPLAYED
    return len(read_arrays(path, ["update"])["update"]) if path.is_file() else 0


def best_score(directory: Path) -> float | None:
    path = directory / BEST
    return load(path).score if path.is_file() else None


def latest(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"{PREFIX}*.npz")) if directory.is_dir() else []
    return found[-1] if found else None


def load(path: Path) -> Checkpoint:
    data = read_arrays(path)
    try:
        meta = json.loads(str(data["meta"]))
        return Checkpoint(meta["update"], meta["frames"], meta["wall_time"], meta["restarts"],
                          data["weights"],
                          [data[f"opt{i}"] for i in range(meta["optimizer_arrays"])],
                          meta.get("score"))
    except (ValueError, KeyError) as exc:
        raise DdrlError(f"checkpoint {path} is damaged or not a ddrl checkpoint ({exc})") from None


def read_meta(path: Path) -> dict:
    """A checkpoint's counters (update, frames, wall_time, restarts, score) without reading
    its arrays."""
    try:
        with np.load(path) as data:
            return json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DdrlError(f"checkpoint {path} is damaged or not a ddrl checkpoint ({exc})") from None


def latest_intact(directory: Path) -> tuple[Path | None, Checkpoint | None, list[str]]:
    """The newest checkpoint that loads (its path and contents, so nobody reads it twice), and
    one line per newer one that did not (a disk that filled up or a copy cut short can damage
    a file after its atomic rename)."""
    damaged = []
    for path in sorted(directory.glob(f"{PREFIX}*.npz"), reverse=True) if directory.is_dir() else []:
        try:
            return path, load(path), damaged
        except DdrlError as exc:
            damaged.append(str(exc))
    return None, None, damaged
