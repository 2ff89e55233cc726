"""Runs of one game at several settings, each repeated over seeds (an ablation or a comparison:
`ddrl sweep` lines x seeds) as one row per setting and one figure with a colour per setting.

A setting is what the runs' configs differ in besides the seed: the comparison a researcher
reads is between settings, each over its seeds, not between single runs.
"""
from __future__ import annotations

import json

import pandas as pd
from matplotlib.figure import Figure

from analysis.load import Run
from analysis.plots import new_figure, time_unit
from analysis.summary import config_differences, over_seeds

# The key that tells repeats of one setting apart (a rank count is a setting).
REPEAT_KEY = "run.seed"


def setting_keys(runs: list[Run]) -> list[str] | None:
    """The config keys the settings differ in, or None when the runs are not a comparison of
    repeated settings (one game, two settings or more, one of them run more than once)."""
    if len({r.game for r in runs}) != 1:
        return None
    keys = [k for k in config_differences(runs) if k != REPEAT_KEY]
    settings = setting_labels(runs, keys)
    if not keys or len(set(settings)) == len(runs):
        return None
    return keys


def _text(value: object) -> str:
    # As a job file spells it (true, [256, 256]); a key a run's config lacks is "-".
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def setting_labels(runs: list[Run], keys: list[str]) -> list[str]:
    """`dqn.atoms=51, dqn.prioritized=true` per run, from the keys' values in its config."""
    flats = [r.flat_config() for r in runs]
    return [", ".join(f"{k}={_text(flat.get(k))}" for k in keys) for flat in flats]


def setting_table(summary: pd.DataFrame, runs: list[Run], keys: list[str]) -> pd.DataFrame:
    """One row per setting, in the order the settings first appear: its keys' values, then
    `over_seeds` of its runs and their median frames/s (evaluations included)."""
    labels = setting_labels(runs, keys)
    rows = []
    for label in dict.fromkeys(labels):
        members = summary[[lab == label for lab in labels]]
        first = runs[labels.index(label)].flat_config()
        rows.append({**{k: _text(first.get(k)) for k in keys}, **over_seeds(members),
                     "frames_per_s": (members["frames"] / members["wall_time"]).median()})
    return pd.DataFrame(rows)


def plot_settings(runs: list[Run], keys: list[str], target: float | None = None) -> Figure:
    """Greedy eval against frames (left) and wall time (right), a colour per setting and a
    line per run, and the target as a dotted line; the legend names each setting once."""
    labels = setting_labels(runs, keys)
    order = list(dict.fromkeys(labels))
    fig, axes = new_figure(1, 2)
    unit, scale = time_unit(max((r.progress().wall_time for r in runs), default=0.0))
    for run, label in zip(runs, labels):
        evals = run["eval"]
        if not len(evals):
            continue
        i = order.index(label)
        for ax, (x_name, x_scale) in zip(axes[0], (("frames", 1.0), ("wall_time", scale))):
            shown = label not in ax.get_legend_handles_labels()[1]
            ax.plot(evals[x_name] / x_scale, evals["mean_return"], color=f"C{i % 10}",
                    marker="o", markersize=2, label=label if shown else "_" + label)
    for ax, xlabel in zip(axes[0], ("frames", f"wall time [{unit}]")):
        if target is not None:
            ax.axhline(target, color="gray", ls=":")
        ax.set(xlabel=xlabel, ylabel="greedy eval", title=f"{runs[0].game}: a colour per setting")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig
