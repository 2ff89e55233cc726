"""The projection's frames at a node count: log-log between measured rank counts, and a
median that rests on a run that missed the target is a lower bound, never the median of the
runs that reached it."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from ddrl.bench.project import Point, _rate, interpolate


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
