"""Figures from run logs; every function returns a matplotlib Figure (tests count its lines).

Figures are built on the Agg canvas directly instead of through pyplot, so importing this
module from a notebook or a batch job never switches anyone's global backend.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullLocator

from analysis.load import Run
from analysis.scaling import scaling_table
from analysis.scores import detection_lag, resolve_target, to_confirmed_target, to_online_target

# Matplotlib keeps labels starting with "_" out of legends: one legend entry per run.
_HIDDEN = "_"


def new_figure(rows: int, cols: int, width: float = 6.0,
               height: float = 4.0) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(cols * width, rows * height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for a time axis: seconds for smoke runs, hours for paper-scale runs."""
    for unit, scale in (("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * scale:
            return unit, scale
    return "s", 1.0


def smooth(values: pd.Series, window: int = 0) -> pd.Series:
    """Rolling mean of online returns; `window=0` picks a tenth of the episodes, at most 100."""
    window = window or max(1, min(100, len(values) // 10))
    return values.rolling(window, min_periods=1).mean()


def plot_learning_curves(runs: list[Run], labels: list[str], target: float | None = None,
                         window: int = 0, references: pd.DataFrame | None = None) -> Figure:
    """Eval mean +- std (solid, band) and max (dashed), and smoothed online score, vs frames
    (left) and wall time (right): figs 3-5 and 9 of the paper.

    Axes [0, *] hold two lines per run with eval rows, plus one for the target, and the
    evaluations cut short (`eval.max_return`) as faint crosses; axes [1, *]
    one line per run with episodes. A run that reached its target adds a star (unlabelled):
    its confirmed weights on the eval axes (on the wall-time one with a line to when it was
    known), its online crossing on the online axes. Published scores (`references`: label, frames, score)
    go on the eval-vs-frames axes as black markers, one line per label.
    """
    fig, axes = new_figure(2, 2)
    unit, scale = time_unit(max((r.progress().wall_time for r in runs), default=0.0))
    for i, (run, label) in enumerate(zip(runs, labels)):
        color = f"C{i % 10}"
        evals = run["eval"]
        episodes = run["episodes"].sort_values("frames", kind="stable")
        online = smooth(episodes["return"], window)
        for col, (x_name, x_scale) in enumerate((("frames", 1.0), ("wall_time", scale))):
            if len(evals):
                x = evals[x_name] / x_scale
                mean, std = evals["mean_return"], evals["std_return"]
                ax = axes[0, col]
                # Markers: evaluations are sparse, and a run with one eval row has no line.
                ax.plot(x, mean, color=color, marker="o", markersize=3, label=label)
                ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
                ax.plot(x, evals["max_return"], color=color, ls="--", label=_HIDDEN + "max")
            cut = run.tables.get("eval_cut")
            if cut is not None and len(cut):
                # Stopped once the target was out of reach: no score, but where the run was
                # (the mean of the games that ended first); in focused runs most rows are these.
                axes[0, col].scatter(cut[x_name] / x_scale, cut["mean_return"], color=color,
                                     marker="x", s=12, alpha=0.5, label=_HIDDEN + "cut")
            if len(episodes):
                axes[1, col].plot(episodes[x_name] / x_scale, online, color=color, label=label)
        _mark_target(axes, run, target, color, scale)
    if references is not None:
        for j, (label, points) in enumerate(references.groupby("label", sort=False)):
            axes[0, 0].plot(points["frames"], points["score"], color="black", ls=":",
                            marker="os^vDP"[j % 6], markersize=6, label=label)
    for col, xlabel in enumerate(("frames", f"wall time [{unit}]")):
        if target is not None:
            axes[0, col].axhline(target, color="gray", ls=":", label=_HIDDEN + "target")
        axes[0, col].set(xlabel=xlabel, ylabel="eval return",
                         title="evaluation: mean +- std (solid), max (dashed)")
        axes[1, col].set(xlabel=xlabel, ylabel="episode return", title="online score (smoothed)")
    _legends(axes)
    return fig


def _mark_target(axes, run: Run, target: float | None, color: str, scale: float) -> None:
    """The confirmed target: a star at its weights (frames, wall time) and, on the wall-time
    axes, a line from there to when the run knew it; the online crossing: a star on the
    online axes."""
    t_confirmed, f_confirmed = to_confirmed_target(run, target)
    goal = resolve_target(run, target)
    if not math.isnan(t_confirmed):
        axes[0, 0].plot([f_confirmed], [goal], color=color, marker="*", markersize=12,
                        label=_HIDDEN + "confirmed")
        lag = detection_lag(run, target)
        known = t_confirmed + (0.0 if math.isnan(lag) else lag)
        axes[0, 1].plot([t_confirmed / scale, known / scale], [goal, goal], color=color,
                        marker="*", markersize=12, markevery=[0], lw=3,
                        label=_HIDDEN + "confirmed, then known")
    t_online, f_online = to_online_target(run, target)
    if not math.isnan(t_online):
        for col, x in enumerate((f_online, t_online / scale)):
            axes[1, col].plot([x], [goal], color=color, marker="*", markersize=12,
                              label=_HIDDEN + "online at the target")


def plot_losses(runs: list[Run], labels: list[str]) -> Figure:
    """Total, policy and value loss and entropy vs frames, one line per run (figs 4b, 5)."""
    fig, axes = new_figure(2, 2)
    columns = ("loss", "policy_loss", "value_loss", "entropy")
    for i, (run, label) in enumerate(zip(runs, labels)):
        train = run["train"]
        if not len(train):
            continue
        for ax, column in zip(axes.flat, columns):
            ax.plot(train["frames"], train[column], color=f"C{i % 10}", label=label)
    for ax, column in zip(axes.flat, columns):
        ax.set(xlabel="frames", ylabel=column, title=column.replace("_", " "))
    _legends(axes)
    return fig


def plot_scaling(summary: pd.DataFrame) -> Figure:
    """Time-to-target vs workers (mean +- std, log-log) with the ideal linear line (fig. 8),
    and parallel efficiency. Each axes has one labelled measured line and one ideal line;
    the ideal line spans every worker count, also those where no run reached the target.
    """
    table = scaling_table(summary)
    reached = table.dropna(subset=["time_mean"])
    fig, axes = new_figure(1, 2)
    ax_time, ax_eff = axes[0]
    unit, scale = time_unit(table["time_mean"].max() if len(reached) else 0.0)
    ax_time.errorbar(reached["workers"], reached["time_mean"] / scale,
                     yerr=reached["time_std"].fillna(0) / scale,
                     marker="o", capsize=3, label="measured (mean +- std)")
    ax_time.plot(table["workers"], table["ideal"] / scale, ls="--", color="gray",
                 label="ideal linear")
    ax_time.set(xscale="log", yscale="log", xlabel="workers", ylabel=f"time to target [{unit}]",
                title=f"time to target ({table['reached'].sum()} of {table['runs'].sum()} runs)")
    # Plain numbers on the log time axis: a decade rarely fits, so 10^1 alone says little.
    for axis_ticks in (ax_time.yaxis.set_major_formatter, ax_time.yaxis.set_minor_formatter):
        axis_ticks(FormatStrFormatter("%g"))
    ax_eff.plot(reached["workers"], reached["efficiency"], marker="o", label="measured")
    ax_eff.plot(table["workers"], np.ones(len(table)), ls="--", color="gray", label="ideal linear")
    ax_eff.set(xscale="log", xlabel="workers", ylabel="speed-up / workers ratio",
               title="scaling efficiency")
    for ax in (ax_time, ax_eff):
        _ticks_at(ax, table["workers"])
    _legends(axes)
    return fig


def plot_throughput(summary: pd.DataFrame, key: str) -> Figure:
    """Mean data points per second against one config value, mean +- std over the runs
    sharing it (figs 6-7: dp/s vs FC width, vs parameter servers). One line.
    """
    by_value = summary.groupby(key)["dp_per_s"].agg(["mean", "std"]).reset_index()
    fig, axes = new_figure(1, 1)
    ax = axes[0, 0]
    numeric = pd.api.types.is_numeric_dtype(by_value[key]) and (by_value[key] > 0).all()
    x = by_value[key] if numeric else by_value[key].astype(str)
    ax.errorbar(x, by_value["mean"], yerr=by_value["std"].fillna(0), marker="o", capsize=3)
    if numeric:
        # The paper sweeps powers of two (16..256 neurons, 1..8 servers).
        ax.set_xscale("log", base=2)
        _ticks_at(ax, x)
    ax.set(xlabel=key, ylabel="data points / s", title=f"processing speed vs {key}")
    return fig


def plot_ranks(run: Run) -> Figure:
    """Per-rank throughput over time (one line per rank), mean compute vs sync seconds per
    update (a straggler computes longest while the others wait in sync), and how often each
    rank's gradient was among those aggregated.
    """
    ranks = run["ranks"]
    fig, axes = new_figure(1, 3, width=5.0)
    ax_rate, ax_time, ax_used = axes[0]
    unit, scale = time_unit(ranks["wall_time"].max() if len(ranks) else 0.0)
    for rank, rows in ranks.groupby("rank"):
        ax_rate.plot(rows["wall_time"] / scale, rows["dp_per_s"], label=f"rank {rank}")
    ax_rate.set(xlabel=f"wall time [{unit}]", ylabel="data points / s", title="throughput per rank")
    means = ranks.groupby("rank")[["t_compute", "t_sync", "contributed"]].mean()
    pos = np.arange(len(means))
    ax_time.bar(pos - 0.2, means["t_compute"], width=0.4, label="compute")
    ax_time.bar(pos + 0.2, means["t_sync"], width=0.4, label="sync (waiting)")
    title = "seconds per update"
    if len(means):
        title += f" (slowest: rank {means['t_compute'].idxmax()})"
    ax_time.set(xticks=pos, xticklabels=means.index, xlabel="rank", ylabel="seconds", title=title)
    ax_used.bar(pos, means["contributed"])
    ax_used.set(xticks=pos, xticklabels=means.index, xlabel="rank", ylim=(0, 1.05),
                ylabel="fraction of updates", title="gradient aggregated")
    _legends(axes)
    return fig


def _ticks_at(ax: Axes, values: pd.Series) -> None:
    """x ticks exactly at the swept values (a log axis would otherwise label only decades)."""
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _legends(axes: np.ndarray) -> None:
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
