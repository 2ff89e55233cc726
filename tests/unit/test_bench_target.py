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


def _log(run_dir: Path, frames: int, evals: list[tuple[int, float, int]]) -> None:
    """A run of `frames` frames at 10,000 frames/s whose evaluations are (frames, mean,
    games)."""
    run_dir.mkdir()
    cfg = load_config(JOBS / "pong-ppo.toml")
    log = RunLog.create(run_dir / "log.h5", {"config": cfg.to_json(), "cores": 2})
    log.append("train", {"update": frames // 1000, "frames": frames, "wall_time": frames / 1e4})
    for at, mean, games in evals:
        log.append("eval", {"update": at // 1000, "frames": at, "wall_time": at / 1e4,
                            "mean_return": mean, "episodes": games, "cut": 0, "seconds": 5.0,
                            "cpu_seconds": 2.0, "known_at": at / 1e4 + 30})
    log.close()


def test_a_seed_that_missed_the_target_bounds_its_row_and_the_median(tmp_path):
    """Seed 0 confirms at 6M frames; seeds 1 and 2 stop at their budgets, 4M and 9M frames,
    without it. Seed 1 may have needed anything past 4M, so the median is at least 6M, not 6M
    (nor 9M, nor "-", which the old report printed); each missed seed says where it stood."""
    runs = [tmp_path / f"seed_{s}" for s in range(3)]
    _log(runs[0], 7_000_000, [(3_000_000, -5.0, 10), (6_000_000, 18.4, 10),
                              (6_000_000, 18.9, 50)])
    _log(runs[1], 4_000_000, [(2_000_000, 3.0, 10), (4_000_000, -2.5, 10)])
    _log(runs[2], 9_000_000, [(8_000_000, 18.2, 10), (8_000_000, 16.0, 50),
                              (9_000_000, 17.5, 10)])
    text = report("pong-ppo.toml", runs, 18.0, "cpu")
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:6]}
    assert rows["1"][1:4] == ["no", ">", "4,000,000"], text
    assert rows["2"][1:4] == ["no", ">", "9,000,000"], text
    assert rows["median"][1:4] == ["1/3", ">", "6,000,000"], text
    # 600 s to seed 0's weights, 400 s of seed 1's whole run: the minutes' median is bounded too.
    assert rows["median"][4:6] == [">", "10.0"], text
    assert "seed 1: not confirmed in its 4,000,000 frames; the last evaluation -2.5 over 10 " \
        "games at 4,000,000 frames, the best +3.0 over 10 games at 2,000,000 frames" in text, text
    assert "seed 2: not confirmed in its 9,000,000 frames; the last evaluation +17.5 over 10 " \
        "games at 9,000,000 frames, the best +18.2 over 10 games at 8,000,000 frames" in text, text
