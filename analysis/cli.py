"""`ddrl analyze RUN_DIR... [--target SCORE] [--out DIR]`: summary table and figures; runs of
several games also get a table per game and a grid of curves (`analysis/games.py`), runs of
several settings x seeds a table per setting and its figure (`analysis/comparison.py`)."""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pandas as pd

from analysis.comparison import plot_settings, setting_keys, setting_table
from analysis.games import game_table, plot_games
from analysis.load import Run, load_runs
from analysis.plots import plot_learning_curves, plot_losses, plot_ranks, plot_scaling, plot_throughput, save
from analysis.reference import load_reference
from analysis.scaling import scaling_table
from analysis.scores import resolve_target
from analysis.summary import config_differences, format_summary, headline, run_labels, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories (or their log.h5 files); running jobs are fine")
    parser.add_argument("--target", type=float, default=None,
                        help="score for time- and frames-to-target "
                             "(default: each run's eval.target)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write summary.csv and the PNGs "
                             "(default: the runs' common parent directory + /analysis)")
    parser.add_argument("--reference", action="append", default=[], metavar="FILE.csv|NAME",
                        help="published scores (label,frames,score) to draw beside the eval "
                             "curve; a NAME picks a shipped file (pong, breakout); repeatable")
    parser.add_argument("--window", type=int, default=0,
                        help="episodes in the online-score rolling mean (default: automatic)")


def default_out(runs: list[Run]) -> Path:
    return Path(os.path.commonpath([r.path.parent.resolve() for r in runs])) / "analysis"


def shared_target(runs: list[Run], target: float | None) -> float | None:
    """The target line to draw: --target, or `eval.target` when all runs agree on it."""
    targets = {resolve_target(r, target) for r in runs}
    return targets.pop() if len(targets) == 1 else None


def sweep_key(runs: list[Run]) -> str | None:
    """The one config key a set of runs sweeps (seeds are repeats, not a sweep), if any;
    list-valued keys (`model.hidden`) have no axis to plot them on."""
    keys = [k for k in config_differences(runs) if k != "run.seed"]
    if len(keys) != 1 or any(isinstance(r.flat_config().get(keys[0]), list) for r in runs):
        return None
    return keys[0]


def _file_name(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "run"


def run(args: argparse.Namespace) -> int:
    references = [load_reference(r) for r in args.reference]
    runs = load_runs(args.runs)
    out = args.out or default_out(runs)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, args.target)
    print(format_summary(summary))
    for _, row in summary.iterrows():
        print(headline(row))

    summary.to_csv(out / "summary.csv", index=False)
    written = [out / "summary.csv"]
    labels = run_labels(runs)
    written.append(save(plot_learning_curves(runs, labels, shared_target(runs, args.target),
                                             args.window,
                                             pd.concat(references) if references else None),
                            out / "curves.png"))
    written.append(save(plot_losses(runs, labels), out / "losses.png"))
    for r in runs:
        if len(r["ranks"]):
            written.append(save(plot_ranks(r), out / f"ranks-{_file_name(r.name)}.png"))
    if summary["workers"].nunique() > 1:
        scaling_table(summary).to_csv(out / "scaling.csv", index=False)
        written.append(out / "scaling.csv")
        if summary["time_to_target"].notna().any():
            written.append(save(plot_scaling(summary), out / "scaling.png"))
        else:
            print("no run reached the target score: no scaling figure")
    if summary["game"].nunique() > 1:
        games = game_table(summary)
        print("\nper game, over its seeds (medians; HNS = human-normalised score):")
        print(format_summary(games))
        games.to_csv(out / "games.csv", index=False)
        written += [out / "games.csv", save(plot_games(runs), out / "games.png")]
    keys = setting_keys(runs)
    if keys is not None:
        settings = setting_table(summary, runs, keys)
        print("\nper setting, over its seeds (medians):")
        print(format_summary(settings))
        settings.to_csv(out / "settings.csv", index=False)
        written += [out / "settings.csv",
                    save(plot_settings(runs, keys, shared_target(runs, args.target)),
                         out / "settings.png")]
    key = sweep_key(runs)
    if key is not None:
        written.append(save(plot_throughput(summary, key),
                            out / f"throughput-{_file_name(key)}.png"))
    for path in written:
        print(f"wrote {path}")
    return 0
