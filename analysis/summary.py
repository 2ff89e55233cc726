"""One row per run: size, progress, scores, time-to-target, throughput (the paper's table 3)."""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from analysis.load import Run
from analysis.moments import STILL, STOPPED, still_share
from analysis.scores import (
    detection_lag,
    eval_share,
    held_share,
    human_normalized,
    resolve_target,
    to_confirmed_target,
    to_online_target,
    to_target,
)

# Keys that say how a run was kept (its time limit, checkpoints, logging, the evaluator's
# share of the CPU), not what it learns: runs of one sweep line on CPUs of different speeds,
# one of them given more minutes, are still one setting.
BOOKKEEPING = frozenset({
    "run.max_minutes", "run.checkpoint_minutes", "run.keep_checkpoints", "run.log_every",
    "run.progress_seconds", "run.tensorboard", "run.wandb", "dqn.save_replay", "eval.nice",
    "eval.cpu_share"})


def config_differences(runs: list[Run]) -> list[str]:
    """Dotted config keys (and `ranks`) whose values are not the same in all runs, but for
    `BOOKKEEPING`'s."""
    flats = [r.flat_config() for r in runs]
    keys = sorted(set().union(*flats) - BOOKKEEPING) if flats else []
    # Lists are unhashable: compare values through their JSON text.
    return [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]


# Beyond this many differing keys (runs of different jobs) a label would cover the plot.
MAX_LABEL_KEYS = 3


def run_labels(runs: list[Run]) -> list[str]:
    """Legend labels naming what differs between the runs, e.g. `optim.eps=1e-08, ranks=4`;
    the run names when more than `MAX_LABEL_KEYS` keys differ."""
    diff = config_differences(runs)
    if len(diff) > MAX_LABEL_KEYS:
        return [r.name for r in runs]
    labels = [", ".join(f"{k}={r.flat_config().get(k)}" for k in diff) or r.name for r in runs]
    if len(set(labels)) < len(labels):  # repeats of one configuration: tell them apart
        labels = [f"{r.name}: {lab}" if lab != r.name else lab for r, lab in zip(runs, labels)]
    return labels


# The training games whose mean is the run's online score at its end (Schulman et al. 2017
# report the last 100 episodes).
ONLINE_GAMES = 100


def last_games_mean(episodes: pd.DataFrame, n: int) -> float:
    """Mean return of the last `n` games in the log to end (an all-reduce job logs rank 0's),
    NaN for a run without any."""
    if not len(episodes):
        return math.nan
    return float(episodes.sort_values("frames", kind="stable")["return"].iloc[-n:].mean())


def summarize(runs: list[Run], target: float | None = None) -> pd.DataFrame:
    """The summary table; `target` overrides each run's `eval.target`. Times are seconds."""
    diff = [k for k in config_differences(runs) if k != "ranks"]
    rows = []
    for run in runs:
        evals, train, episodes = run["eval"], run["train"], run["episodes"]
        done = run.progress()
        best = evals.loc[evals["mean_return"].idxmax()] if len(evals) else None
        t_target, f_target = to_target(run, target)
        t_confirmed, f_confirmed = to_confirmed_target(run, target)
        t_online, f_online = to_online_target(run, target, ONLINE_GAMES)
        goal = resolve_target(run, target)
        row: dict[str, Any] = {
            "run": run.name,
            "game": run.game,
            "ranks": run.world_size,
            "workers": run.workers,
            "effective_batch": run.effective_batch,
            "frames": done.frames,
            "wall_time": done.wall_time,
            "updates": done.updates,
            "restarts": int(run.attrs.get("restarts", 0)),
            "best_eval": float(best["mean_return"]) if best is not None else math.nan,
            # Table 3 reports the best score together with the time it took to get there.
            "best_eval_time": float(best["wall_time"]) if best is not None else math.nan,
            "last_eval": float(evals["mean_return"].iloc[-1]) if len(evals) else math.nan,
            # As published PPO and A2C scores are taken: the training games' mean at the end.
            "online_last100": last_games_mean(episodes, ONLINE_GAMES),
            "target": math.nan if goal is None else float(goal),
            # The first evaluation at the target; the first whose weights confirmed it over
            # eval.confirm_episodes games; the first with the last 100 training games' mean
            # at it (the published curves' protocol).
            "time_to_target": t_target,
            "frames_to_target": f_target,
            "time_to_confirmed": t_confirmed,
            "frames_to_confirmed": f_confirmed,
            "time_to_online": t_online,
            "frames_to_online": f_online,
            # Seconds from the confirmed weights' update to the run knowing it; the
            # evaluator's CPU time as a share of the job's cores over the run, and over the
            # training to the confirmed weights (the evaluations that found them left out).
            "detection_lag": detection_lag(run, target),
            "eval_share": eval_share(run, done.wall_time),
            "eval_share_to_confirmed": eval_share(run, t_confirmed, ended_by=True),
            # The ranks' waits for evaluations over the run (their cost in frames/s), and over
            # the training to the confirmed weights (eval.pause_share bounds those).
            "held_share": held_share(run, done.wall_time),
            "held_share_to_confirmed": held_share(run, t_confirmed, ended_by=True),
            "dp_per_s": float(train["dp_per_s"].mean()) if len(train) else math.nan,
            # The share of weights Adam's epsilon held still at the last checkpoint: near 1,
            # the network had stopped learning, whatever its loss showed.
            "adam_still": still_share(run.path.parent, run.config.get("optim", {})),
        }
        row["hns_best"] = human_normalized(row["best_eval"], run.game)
        row.update({k: run.flat_config().get(k) for k in diff})
        rows.append(row)
    return pd.DataFrame(rows)


def over_seeds(runs: pd.DataFrame) -> dict[str, Any]:
    """What a set of `summarize` rows (one setting's or one game's seeds) gives together: the
    median and range of the final and the best greedy eval, the median online score, how many
    reached their target and the median frames and minutes of those that did, and the median
    frames and minutes run."""
    final, best = runs["last_eval"], runs["best_eval"]
    reached = runs["frames_to_target"].dropna()
    # Runs to their frame budget alone have no target to reach.
    targeted = runs["target"].notna().any()
    return {
        "seeds": len(runs),
        "final": median_known(final), "final_min": final.min(), "final_max": final.max(),
        "best": median_known(best), "best_min": best.min(), "best_max": best.max(),
        # Like for like with PPO's published scores: its training games' mean at the end.
        "online_last100": median_known(runs["online_last100"]),
        "target": median_known(runs["target"]) if targeted else math.nan,
        "reached": f"{len(reached)}/{len(runs)}" if targeted else "-",
        "frames_to_target": median_known(reached),
        "minutes_to_target": median_known(runs["time_to_target"]) / 60,
        "confirmed": f"{_column(runs, 'frames_to_confirmed').notna().sum()}/{len(runs)}"
        if targeted else "-",
        "frames_to_confirmed": median_known(_column(runs, "frames_to_confirmed")),
        "minutes_to_confirmed": median_known(_column(runs, "time_to_confirmed")) / 60,
        "detection_lag": median_known(_column(runs, "detection_lag")),
        "eval_share": median_known(_column(runs, "eval_share")),
        "eval_share_to_confirmed": median_known(_column(runs, "eval_share_to_confirmed")),
        "held_share": median_known(_column(runs, "held_share")),
        "held_share_to_confirmed": median_known(_column(runs, "held_share_to_confirmed")),
        "frames_to_online": median_known(_column(runs, "frames_to_online")),
        "frames": median_known(runs["frames"]),
        "minutes": median_known(runs["wall_time"]) / 60,
    }


def median_known(values: pd.Series) -> float:
    """The median of the values known; NaN when there are none (pandas' median of only NaN
    prints numpy's "Mean of empty slice" warning on the user's terminal)."""
    known = values.dropna()
    return float(known.median()) if len(known) else math.nan


def _column(runs: pd.DataFrame, name: str) -> pd.Series:
    """A column of the summary, all NaN in a table made without it."""
    return runs[name] if name in runs else pd.Series(math.nan, index=runs.index)


def _at(seconds: float, frames: float, what: str, missing: str) -> str:
    return missing if math.isnan(seconds) else \
        f"{what} at {seconds / 60:.1f} min ({frames / 1e6:.2f}M frames)"


def headline(row: pd.Series) -> str:
    """A run's time to its target on each protocol, in one line a person reads first, and a
    network that had stopped learning."""
    still = row.get("adam_still", math.nan)
    stopped = "" if not still >= STOPPED else (
        f"; Adam's epsilon held {100 * still:.0f}% of the weights still at the last checkpoint "
        f"(their gradients' RMS under optim.eps / {1 / STILL:.0f}): the network had stopped "
        f"learning")
    if math.isnan(row["target"]):
        return f"{row['run']}: no target{stopped}"
    lag = row.get("detection_lag", math.nan)
    known = "" if math.isnan(lag) else f", known {lag:.0f} s later"
    share = row.get("eval_share", math.nan)
    before = row.get("eval_share_to_confirmed", math.nan)
    def to_weights(share: float) -> str:
        return "" if math.isnan(share) else f" ({100 * share:.1f}% to the confirmed weights)"
    held = row.get("held_share", math.nan)
    waited = "" if math.isnan(held) else (
        f", the ranks waiting {100 * held:.1f}% of the run for it"
        + to_weights(row.get("held_share_to_confirmed", math.nan)))
    online = f"online (last {ONLINE_GAMES} training games)"
    return (f"{row['run']}: target {row['target']:g} "
            + _at(row["time_to_confirmed"], row["frames_to_confirmed"], "confirmed",
                  "not confirmed") + f"{known}; "
            + _at(row["time_to_target"], row["frames_to_target"], "first crossing",
                  "no evaluation at it") + "; "
            + _at(row["time_to_online"], row["frames_to_online"], online, f"{online} not reached")
            + ("" if math.isnan(share) else
               f"; evaluator {100 * share:.1f}% of the CPU{to_weights(before)}{waited}")
            + stopped)


def format_summary(summary: pd.DataFrame) -> str:
    return summary.to_string(index=False, float_format=lambda v: f"{v:.6g}", na_rep="-")

