"""The projection's frames at a node count: log-log between measured rank counts, and a
median that rests on a run that missed the target is a lower bound, never the median of the
runs that reached it."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import pytest

from ddrl.bench.project import (
    Point,
    _rate,
    add_arguments,
    interpolate,
    measure_record,
    measure_speed_record,
    run,
)
from ddrl.errors import DdrlError


def point(ranks: int, frames: list[float], reached: list[bool]) -> Point:
    return Point(ranks, frames, [f / 256 for f in frames], reached, [1000.0] * len(frames), set())


def known(*points: Point) -> list[tuple[int, float, bool]]:
    return [(p.ranks, *p.median("frames")) for p in points]


def test_missed_seeds_make_the_median_a_lower_bound():
    # One of two seeds reached 18 at 6.95M, the other ran 15.1M without: the median is
    # past 11M, not 6.95M.
    median, exact = point(64, [6.95e6, 15.1e6], [True, False]).median("frames")
    assert (median, exact) == (pytest.approx(11.025e6), False)
    assert point(64, [6.95e6, 15.1e6, 9e6], [True, False, True]).median("frames") == (9e6, True)


def test_exact_counts_interpolate_log_log():
    pts = known(point(2, [8e6], [True]), point(8, [2e6], [True]))
    assert interpolate(pts, 2, False) == (8e6, "measured", True)
    value, how, exact = interpolate(pts, 4, False)
    assert value == pytest.approx(4e6) and how == "interpolated" and exact
    assert interpolate(pts, 1, False) == (8e6, "at most the 2-rank figure", True)


def test_a_lower_bound_at_either_end_bounds_what_rests_on_it():
    pts = known(point(2, [8e6], [True]), point(64, [6.95e6, 15.1e6], [True, False]))
    value, how, exact = interpolate(pts, 64, False)
    assert how == "measured, a lower bound" and not exact
    value, how, exact = interpolate(pts, 32, False)
    assert how == "interpolated, a lower bound" and not exact and 8e6 < value < 11.1e6
    assert math.isnan(interpolate(pts, 128, True)[0])
    low = known(point(2, [10e6], [False]), point(8, [2e6], [True]))
    assert math.isnan(interpolate(low, 1, False)[0])


def test_past_the_largest_count_only_when_asked():
    pts = known(point(2, [8e6], [True]), point(8, [4e6], [True]))
    value, how, exact = interpolate(pts, 16, False)
    assert math.isnan(value) and how.startswith("beyond the largest measured batch")
    value, how, exact = interpolate(pts, 32, True)
    assert value == pytest.approx(2e6) and how == "EXTRAPOLATED"


def test_a_rank_rate_counts_the_time_of_counted_frames_only():
    """Rollouts of 1,000 frames every 10 s, a row each second: three rollouts counted, the
    run stopped 9 s into a fourth whose frames never arrived. 100 frames/s, not 2,000 / 29 s."""
    rows = [(t + 1, 1000 * (t // 10 + 1)) for t in range(30)]
    train = pd.DataFrame(rows, columns=["wall_time", "frames"])
    assert _rate(train) == pytest.approx(100.0)
    assert math.isnan(_rate(train.head(5)))


RESULTS = Path(__file__).parents[2] / "docs" / "results"
RULE = "the paper's Adam (beta1 0.8, beta2 0.75), advantages over the rollout, the mean clipped"
HEADER = ("ranks,minibatches,epochs,rollout,frames_per_point,rule,seed,frames_to_target,"
          "frames_run,criterion\n")


def record(tmp_path: Path, *rows: str) -> str:
    path = tmp_path / "record.csv"
    path.write_text("# a comment line\n" + HEADER + "".join(r + "\n" for r in rows))
    return str(path)


def test_a_record_gives_the_rows_of_its_rules_one_point_a_rank_count(tmp_path):
    path = record(tmp_path,
                  "2,4,4,512,4,recipe,0,4000000,4000000,50 games",
                  "2,4,4,512,4,recipe,1,,10000000,50 games",
                  "2,4,4,512,4,recipe,2,6000000,6000000,10 games",
                  "8,4,4,512,4,other,0,1000000,1000000,50 games",
                  "8,16,4,512,4,big,0,8000000,8000000,50 games")
    two, eight = measure_record(path, ["recipe", "big"])
    assert (two.ranks, two.frames, two.reached) == (2, [4e6, 10e6, 6e6], [True, False, True])
    # An update is one minibatch of every rank: 2 x 512 x 4 frames over 4 x 4 updates.
    assert two.updates == pytest.approx([f / 256 for f in two.frames])
    assert two.median("frames") == (6e6, True)
    assert eight.frames == [8e6] and eight.work == (512, 4, 16)
    assert eight.updates == pytest.approx([8e6 / (8 * 512 * 4 / 64)])
    assert any("big, 50 games" in s for s in eight.sources)


def test_a_record_refuses_two_rules_at_one_rank_count_and_unknown_rules(tmp_path):
    path = record(tmp_path, "8,4,4,512,4,small,0,1000000,1000000,50 games",
                  "8,16,4,512,4,big,0,8000000,8000000,50 games")
    with pytest.raises(DdrlError, match="one rule a rank count"):
        measure_record(path, ["small", "big"])
    with pytest.raises(DdrlError, match="no rows of the rule 'huge'"):
        measure_record(path, ["huge"])
    with pytest.raises(DdrlError, match="its rules: small; big"):
        measure_record(path, [])
    (tmp_path / "bad.csv").write_text("ranks,rule\n2,x\n")
    with pytest.raises(DdrlError, match="no column"):
        measure_record(str(tmp_path / "bad.csv"), ["x"])
    words = record(tmp_path, "8,four,4,512,4,small,0,1000000,1000000,50 games")
    with pytest.raises(DdrlError, match="column minibatches holds a value that is not a number"):
        measure_record(words, ["small"])


def test_a_speed_record_gives_a_rank_rate_by_its_work_and_where_it_came_from(tmp_path):
    path = tmp_path / "speed.csv"
    path.write_text("# how\nrollout,epochs,minibatches,fps_per_core,cpu\n512,4,4,3000,Zen 4\n"
                    "512,4,4,3400,Zen 5\n512,4,32,1800,Zen 4\n")
    speeds, sources = measure_speed_record(str(path))
    assert speeds == {(512, 4, 4): [3000.0, 3400.0], (512, 4, 32): [1800.0]}
    assert sources[(512, 4, 4)] == "speed.csv, Zen 4, Zen 5"


def test_the_documented_projection_runs_from_the_committed_records(capsys):
    """docs/scaling.md's Pong projection, from the records in docs/results: every rank count
    it names measured, its 2 nodes of 32 cores under 2 minutes at 100 Gbit/s."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        str(Path(__file__).parents[2] / "jobs" / "pong-ppo.toml"),
        "--record", str(RESULTS / "frames-to-score.csv"),
        "--rule", "the 2-rank recipe (Adam 1e-3)", "--rule", RULE,
        "--speed-record", str(RESULTS / "rank-speed.csv"),
        "--nodes", "1", "2", "4", "8", "--link", "100gbit"])
    assert run(args) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line[:5].strip().isdigit()}
    assert rows["1"][-1] == rows["2"][-1] == rows["4"][-1] == "measured", rows
    assert float(rows["2"][5]) < 2.0, rows
    assert rows["8"][2] == "-", rows
