"""`ddrl status`'s cells, in-process on a real run log."""
from __future__ import annotations

from pathlib import Path

from analysis.status import line
from ddrl.config import load_config
from ddrl.rundir.log import RunLog

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def _log(run_dir: Path, evals: list[tuple[int, float, int]]) -> None:
    """A finished run of 5,000 updates whose evaluations are (update, mean, cut)."""
    run_dir.mkdir()
    cfg = load_config(JOBS / "pong-ppo.toml")
    log = RunLog.create(run_dir / "log.h5", {"config": cfg.to_json(), "cores": 2})
    log.append("train", {"update": 5000, "frames": 5_000_000, "wall_time": 500.0})
    for update, mean, cut in evals:
        log.append("eval", {"update": update, "frames": 1000 * update, "wall_time": 0.1 * update,
                            "mean_return": mean, "episodes": 10, "cut": cut, "seconds": 5.0,
                            "cpu_seconds": 2.0, "known_at": 0.1 * update + 10})
    log.close()


def test_the_last_evaluation_is_shown_when_it_was_cut_and_the_best_is_of_whole_ones(tmp_path):
    """Evaluations far below the target are cut (`eval.max_return`): a run whose every
    evaluation was cut showed none, for hours; now the latest, marked as cut."""
    _log(tmp_path / "all_cut", [(1000, -21.0, 1), (2000, -20.0, 1)])
    _log(tmp_path / "mixed", [(1000, -21.0, 1), (2000, 3.5, 0), (3000, -2.0, 1)])
    _log(tmp_path / "whole_last", [(1000, -21.0, 1), (2000, 3.5, 0)])
    header = ["run", "state", "frames", "frames/s", "last eval", "best eval"]
    cells = {name: dict(zip(header, line(tmp_path / name)))
             for name in ("all_cut", "mixed", "whole_last")}
    assert (cells["all_cut"]["last eval"], cells["all_cut"]["best eval"]) == ("-20.0 (cut)", "-")
    assert (cells["mixed"]["last eval"], cells["mixed"]["best eval"]) == ("-2.0 (cut)", "3.5")
    assert (cells["whole_last"]["last eval"], cells["whole_last"]["best eval"]) == ("3.5", "3.5")
