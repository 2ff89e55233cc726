"""`ddrl bench target`'s report, in-process on a real run log: what each seed's row counts."""
from __future__ import annotations

import re
from pathlib import Path

from ddrl.bench.target import report
from ddrl.config import load_config
from ddrl.rundir.log import RunLog

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_a_seeds_row_counts_the_cut_evaluations_and_the_evaluators_share(tmp_path):
    """Three evaluations cut out of reach of the target, then a crossing and its
    confirmation: five played, of which two are scores. The evaluator's CPU share over the
    run counts all five; to the confirmed weights, the three that ended before they were
    taken."""
    run_dir = tmp_path / "seed_0"
    run_dir.mkdir()
    cfg = load_config(JOBS / "pong-ppo.toml")
    log = RunLog.create(run_dir / "log.h5", {"config": cfg.to_json(), "cores": 2})
    for i in range(1, 6):
        log.append("train", {"update": 1000 * i, "frames": 256_000 * i, "wall_time": 30.0 * i})
    evals = [(1000, -21.0, 10, 1, 2.4), (2000, -15.0, 10, 1, 2.4), (3000, 2.0, 10, 1, 2.4),
             (4000, 18.5, 10, 0, 10.0), (4000, 19.0, 50, 0, 40.0)]
    for update, mean, games, cut, cpu in evals:
        log.append("eval", {"update": update, "frames": 256 * update, "wall_time": 0.03 * update,
                            "mean_return": mean, "episodes": games, "cut": cut,
                            "seconds": 5.0, "cpu_seconds": cpu,
                            "known_at": 0.03 * update + 20})
    log.close()
    text = report("pong-ppo.toml", [run_dir], 18.0, "cpu")
    row = re.search(r"^\s+0\s+\+19\.0\s.*\s(\d+)\s+([\d.]+)\s+([\d.]+)$", text, re.M)
    assert row is not None, text
    # 57.2 CPU s over 150 s of 2 cores; 7.2 over the 120 s to the weights.
    assert row.groups() == ("5", "19.1", "3.0"), text
