"""Frames to the target against the global batch, per rule (the paper's central result: the
frames stay almost flat as the batch grows): a summary table and its figure from a record of
runs, one row each, real or rehearsed (`sync.virtual_ranks`).

`python -m analysis.batch_scaling RECORD.csv [--out DIR]` prints the table in Markdown and
writes its figure as DIR/RECORD.png (one record, and figure, per game). The record's columns:

- `ranks`, `minibatches` (per rank and epoch), `epochs`, `rollout` (data points a rank's
  rollout holds), `frames_per_point` (frames an agent step: the frame skip);
- `rule`: what keeps the frames flat (a label; rows with the same ranks, minibatches and rule
  are seeds of one setting), `seed`;
- `frames_to_target` (empty where the run did not reach it), `frames_run` (the frames the run
  played: its budget where it did not reach the target), `criterion` (e.g. "50 games").

A run that did not reach the target counts as reaching it past its budget: a median over such
runs is a lower bound and prints as "> X".
"""
from __future__ import annotations

import argparse
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.plots import new_figure, save
from analysis.scores import median_bound

RECORD_COLUMNS = {"ranks", "minibatches", "epochs", "rollout", "frames_per_point", "rule", "seed",
                  "frames_to_target", "frames_run", "criterion"}
# The records' columns of words; every other one holds numbers (or nothing: a missed target).
TEXT_COLUMNS = {"rule", "criterion", "cpu"}


def read_record(path: str | Path, columns: set[str]) -> pd.DataFrame:
    """A record's rows (`#` lines are comments), checked to hold `columns`, those of numbers
    as numbers; a ValueError naming the file and what is wrong."""
    try:
        df = pd.read_csv(path, comment="#")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the record ({e})") from None
    missing = columns - set(df.columns)
    if missing:
        raise ValueError(f"{path}: no column(s) {', '.join(sorted(missing))}")
    for column in sorted(columns - TEXT_COLUMNS):
        try:
            df[column] = pd.to_numeric(df[column])
        except (ValueError, TypeError):
            raise ValueError(f"{path}: column {column} holds a value that is not a number") \
                from None
    return df


def load_record(path: str | Path) -> pd.DataFrame:
    return with_derived(read_record(path, RECORD_COLUMNS))


def with_derived(df: pd.DataFrame) -> pd.DataFrame:
    """A record with the figures its rows imply: the global minibatch, the frames an update
    costs, whether and when a run reached the target (its budget where it did not)."""
    df["global_minibatch"] = df["ranks"] * df["rollout"] // df["minibatches"]
    # Every rank's gradient of one minibatch makes one update, all-reduced.
    df["frames_per_update"] = (df["ranks"] * df["rollout"] * df["frames_per_point"]
                               / (df["epochs"] * df["minibatches"]))
    df["reached"] = df["frames_to_target"].notna()
    df["frames"] = df["frames_to_target"].where(df["reached"], df["frames_run"])
    return df


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (ranks x per-rank minibatches x rule), in the record's order."""
    rows = []
    keys = ["ranks", "global_minibatch", "rule"]
    for (ranks, global_mb, rule), g in df.groupby(keys, sort=False):
        median, exact = median_bound(g["frames"], g["reached"])
        rows.append({"ranks": ranks, "global_minibatch": global_mb, "rule": rule,
                     "seeds": len(g), "reached": int(g["reached"].sum()),
                     "median": median, "exact": exact,
                     "low": g.loc[g["reached"], "frames"].min(),
                     "high": g.loc[g["reached"], "frames"].max(),
                     "updates": median / g["frames_per_update"].iloc[0],
                     "criterion": "; ".join(dict.fromkeys(g["criterion"]))})
    return pd.DataFrame(rows).sort_values(["ranks", "global_minibatch"], kind="stable")


def _millions(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def markdown(table: pd.DataFrame) -> str:
    lines = ["| ranks | global minibatch | rule | seeds reached | frames to the target, median "
             "(reached: min-max) | updates, median | criterion |",
             "|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        median = _millions(r.median) if r.exact else f"> {_millions(r.median)}"
        spread = "" if r.reached == 0 else (
            f" ({_millions(r.low)})" if r.reached == 1 else
            f" ({_millions(r.low)}-{_millions(r.high)})")
        updates = f"{r.updates:,.0f}" if r.exact else f"> {r.updates:,.0f}"
        lines.append(f"| {r.ranks} | {r.global_minibatch:,} | {r.rule} | {r.reached} of "
                     f"{r.seeds} | {median}{spread} | {updates} | {r.criterion} |")
    return "\n".join(lines)


def plot_frames_to_score(df: pd.DataFrame, target_label: str = "the target"):
    """Frames to the target against the ranks (the global batch), one series per rule: filled
    markers for runs that reached it, open ones with an arrow at the budget of those that did
    not; each setting's median joined where it is exact; twice the smallest job's median as
    the line to stay under."""
    # The legend goes under the axes, two columns of wrapped rules, so that it covers no
    # point however many rules the record holds: the figure grows by its rows.
    legend_rows = math.ceil((df["rule"].nunique() + 1) / 2)
    fig, axes = new_figure(1, 1, width=9.0, height=4.5 + 0.33 * legend_rows)
    ax = axes[0][0]
    table = summary_table(df)
    # Matplotlib's cycle without its gray (C7), the colour of the 2x line; past its nine
    # colours the next rules take them again with another marker.
    palette = [f"C{i}" for i in range(10) if i != 7]
    styles = {rule: (palette[i % len(palette)], "os^D"[i // len(palette) % 4])
              for i, rule in enumerate(dict.fromkeys(df["rule"]))}
    rng = np.random.default_rng(0)
    for rule, g in df.groupby("rule", sort=False):
        color, marker = styles[rule]
        # Seeds of one setting side by side, not on top of each other.
        x = g["ranks"] * np.exp(rng.uniform(-0.06, 0.06, len(g)))
        hit = g["reached"].to_numpy()
        ax.scatter(x[hit], g["frames"][hit] / 1e6, color=color, marker=marker, zorder=3,
                   label=rule if hit.any() else None)
        ax.scatter(x[~hit], g["frames"][~hit] / 1e6, facecolors="none", edgecolors=color,
                   marker=marker, zorder=3, label=None if hit.any() else rule)
        for xi, yi in zip(x[~hit], g["frames"][~hit] / 1e6):
            ax.annotate("", (xi, yi * 1.12), (xi, yi),
                        arrowprops={"arrowstyle": "->", "color": color})
        # Every rule starts from the smallest job's setting.
        medians = pd.concat([table[table["exact"]].head(1),
                             table[(table["rule"] == rule) & table["exact"]]]).drop_duplicates()
        if len(medians) > 1:
            ax.plot(medians["ranks"], medians["median"] / 1e6, color=color, alpha=0.6)
    smallest = table[table["exact"]].sort_values("ranks").head(1)
    if len(smallest):
        ax.axhline(2 * smallest["median"].iloc[0] / 1e6, ls="--", color="gray",
                   label=f"2 x the {smallest['ranks'].iloc[0]}-rank median")
    ax.set(xscale="log", xlabel="ranks (the global rollout: ranks x a rank's)",
           ylabel=f"frames to {target_label} [M]",
           title="Frames to the target by the job's size (open: not reached in that many)")
    ticks = sorted(df["ranks"].unique())
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    # The 2x line stays in view where every run needed fewer frames.
    top = max(df["frames"].max(), 2 * smallest["median"].max() if len(smallest) else 0)
    ax.set_ylim(0, math.ceil(top / 1e6 * 1.2))
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [textwrap.fill(label, 62) for label in labels], fontsize=7.5, ncols=2,
               loc="outside lower center")
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.batch_scaling", description=__doc__)
    p.add_argument("record", help="CSV of runs, one row each (the module's docstring)")
    p.add_argument("--out", type=Path, default=Path("."), help="where the figure goes")
    p.add_argument("--target", default="the target", help="the target's name on the y axis")
    args = p.parse_args(argv)
    df = load_record(args.record)
    print(markdown(summary_table(df)))
    args.out.mkdir(parents=True, exist_ok=True)
    figure = args.out / f"{Path(args.record).stem}.png"
    print(f"wrote {save(plot_frames_to_score(df, args.target), figure)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
