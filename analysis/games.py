"""Runs of several games (a suite: games x seeds) as one table per game and one grid of curves.

Per game, over its seeds: the median and range of the final and of the best greedy eval,
their human-normalised scores (HNS), the median of the last 100 training games' mean, frames
and minutes to the run's `eval.target` where it has one (median over the seeds that reached
it), the score of the best action held for a whole game and how many seeds' finals beat it,
and the published scores beside them. The suite's line is the median over the games.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.load import Run
from analysis.plots import new_figure
from analysis.scores import HELD, human_normalized, reference_scores
from analysis.summary import median_known, over_seeds, run_labels


def game_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per game of `summarize`'s table, and a last row `median` over the games."""
    rows = []
    for game, runs in summary.groupby("game", sort=True):
        stats = over_seeds(runs)
        refs = reference_scores(game)
        held = refs["held"]
        rows.append({
            "game": game, **stats,
            "hns_final": np.median([human_normalized(v, game) for v in runs["last_eval"]]),
            "hns_best": np.median([human_normalized(v, game) for v in runs["best_eval"]]),
            **refs,
            # A final at or below it is no evidence that the seed learned the game.
            "above_held": "-" if math.isnan(held)
            else f"{int((runs['last_eval'] > held).sum())}/{len(runs)}",
        })
    table = pd.DataFrame(rows)
    if len(table):
        median = {"game": "median", "seeds": int(table["seeds"].sum()),
                  "hns_final": median_known(table["hns_final"]),
                  "hns_best": median_known(table["hns_best"])}
        table = pd.concat([table, pd.DataFrame([median])], ignore_index=True)
    return table


def plot_games(runs: list[Run]) -> Figure:
    """A panel per game: each run's greedy eval against frames, labelled by what differs
    among the game's runs (the seed, in a suite), with the random score, the best held
    action's and the published ones as horizontal lines."""
    games = sorted({r.game for r in runs})
    cols = min(3, len(games))
    fig, axes = new_figure((len(games) + cols - 1) // cols, cols, width=4.5)
    axes = np.atleast_1d(axes).ravel()
    for ax, game in zip(axes, games):
        game_runs = [r for r in runs if r.game == game]
        # A game's runs may differ in more than the seed (a learning-rate comparison): the
        # legend names whatever differs among them.
        labels = (run_labels(game_runs) if len(game_runs) > 1
                  else [f"run.seed={game_runs[0].setting('run.seed')}"])
        for i, (run, label) in enumerate(zip(game_runs, labels)):
            evals = run["eval"]
            if len(evals):
                ax.plot(evals["frames"], evals["mean_return"], color=f"C{i % 10}", marker="o",
                        markersize=2, label=label)
        line_names = {"random": "random", "held": f"{HELD.get(game, ('',))[0]} held",
                      "paper": "paper, best", "ppo_40m": "PPO, 40M frames"}
        for (key, score), style in zip(reference_scores(game).items(),
                                       (":", (0, (3, 1, 1, 1, 1, 1)), "--", "-.")):
            if not math.isnan(score):
                ax.axhline(score, color="gray", ls=style, label=line_names[key])
        ax.set(title=game, xlabel="frames", ylabel="greedy eval")
        ax.legend(fontsize=7)
    for ax in axes[len(games):]:
        ax.set_visible(False)
    return fig
