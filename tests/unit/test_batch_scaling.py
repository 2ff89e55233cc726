"""Frames to the target against the global batch: medians over seeds that did not all reach
it, and the docs' record read as the table and figure print it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.batch_scaling import load_record, markdown, plot_frames_to_score, summary_table
from analysis.scores import median_bound

RECORDS = sorted((Path(__file__).parents[2] / "docs" / "results").glob("frames-to-score*.csv"))


@pytest.mark.parametrize("frames, reached, median, exact", [
    ([3, 9, 8], [True, True, True], 8, True),
    # A run past its budget sorts last: the median of three stays exact with one missing...
    ([3, 20, 8], [True, False, True], 8, True),
    # ...but not with two: it is the budget, a lower bound.
    ([3, 12, 15], [True, False, False], 12, False),
    # Even counts average the middle two; a missing one among them bounds it.
    ([7, 15], [True, False], 11, False),
    ([2, 4, 6, 30], [True, True, True, False], 5, True),
    # A budget below another run's hit: that run may have needed anything past 3, so the
    # median is only bounded, by 5, not 9...
    ([5, 3, 9], [True, False, True], 5, False),
    # ...and two such budgets bound it by the larger.
    ([11.68, 8.0, 10.1], [True, False, False], 10.1, False),
])
def test_median_counts_a_missed_target_as_past_the_budget(frames, reached, median, exact):
    assert median_bound(pd.Series(frames, dtype=float), pd.Series(reached)) == (median, exact)


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.stem)
def test_the_docs_records_give_one_row_per_setting(record):
    df = load_record(record)
    table = summary_table(df)
    assert len(table) == len(df.groupby(["ranks", "minibatches", "rule"]))
    recipe = table.iloc[0]
    # Two ranks of 512 data points in 4 minibatches: 256 a gradient step, 256 frames an update
    # (4 frames a point, 4 epochs x 4 minibatches per rollout of 4,096 frames).
    assert (recipe.ranks, recipe.global_minibatch, recipe.exact) == (2, 256, True)
    assert recipe["updates"] == pytest.approx(recipe["median"] / 256)
    text = markdown(table)
    assert text.count("\n") == len(table) + 1 and ("> " in text) == (not table["exact"].all())
    fig = plot_frames_to_score(df)
    assert len(fig.axes[0].collections) >= table["rule"].nunique()


def test_a_record_without_a_column_is_refused(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("ranks,seed\n2,0\n")
    with pytest.raises(ValueError, match="no column"):
        load_record(path)
