"""Time-to-target against worker count, with the ideal linear speed-up (the paper's fig. 8)."""
from __future__ import annotations

import math

import pandas as pd


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per worker count, from a `summarize` table.

    Repeats of a worker count are averaged over the runs that reached the target (`reached`
    of `runs`), as fig. 8 plots mean +- std. The ideal time is the smallest worker count's
    time divided by the relative compute (the paper's "theoretical linear speedup"), and
    efficiency is measured speed-up over that relative compute.
    """
    times = summary.groupby("workers")["time_to_target"]
    table = pd.DataFrame({
        "runs": times.size(), "reached": times.count(),
        "time_mean": times.mean(), "time_std": times.std(),
    }).reset_index()
    reached = table.dropna(subset=["time_mean"])
    if reached.empty:
        base_workers, base_time = math.nan, math.nan
    else:
        base_workers, base_time = reached["workers"].iloc[0], reached["time_mean"].iloc[0]
    table["ideal"] = base_time * base_workers / table["workers"]
    table["speedup"] = base_time / table["time_mean"]
    table["efficiency"] = table["speedup"] * base_workers / table["workers"]
    return table
