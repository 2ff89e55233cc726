"""`ddrl bench target`'s report, in-process on a real run log: what each seed's row counts."""
from __future__ import annotations

import re
from pathlib import Path

from ddrl.bench.target import report
from ddrl.config import load_config
from ddrl.rundir.log import RunLog

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_a_seeds_evaluations_count_the_cut_ones(tmp_path):
    """Three evaluations cut out of reach of the target, then a crossing and its
    confirmation: five played, of which two are scores."""
    run_dir = tmp_path / "seed_0"
    run_dir.mkdir()
    cfg = load_config(JOBS / "pong-ppo.toml")
    log = RunLog.create(run_dir / "log.h5", {"config": cfg.to_json()})
    for i in range(1, 6):
        log.append("train", {"update": 1000 * i, "frames": 256_000 * i, "wall_time": 30.0 * i})
    evals = [(1000, -21.0, 10, 1), (2000, -15.0, 10, 1), (3000, 2.0, 10, 1),
             (4000, 18.5, 10, 0), (4000, 19.0, 50, 0)]
    for update, mean, games, cut in evals:
        log.append("eval", {"update": update, "frames": 256 * update, "wall_time": 0.03 * update,
                            "mean_return": mean, "episodes": games, "cut": cut,
                            "known_at": 0.03 * update + 20})
    log.close()
    text = report("pong-ppo.toml", [run_dir], 18.0, "cpu")
    row = re.search(r"^\s+0\s+\+19\.0\s.*\s(\d+)$", text, re.M)
    assert row is not None, text
    assert row.group(1) == "5", text
