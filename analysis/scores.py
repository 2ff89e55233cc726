"""Score arithmetic: human-normalized scores and when a run first reached a target."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.load import Run

# game -> (random, human) evaluation scores, from the table in design/REFERENCE.md
# ("Atari conventions": Mnih et al. 2015 / Machado et al. 2018, as quoted there). The random
# column is Mnih et al. 2015's; the human column is the no-op-start one later papers use
# (e.g. DQN Zoo's atari_data.py), not Mnih et al. 2015's own human scores.
BASELINES: dict[str, tuple[float, float]] = {
    "Pong": (-20.7, 14.6),
    "Breakout": (1.7, 30.5),
    "Boxing": (0.1, 12.1),
    "Seaquest": (68.4, 42054.7),
    "SpaceInvaders": (148.0, 1668.7),
    "BeamRider": (363.9, 16926.5),
}

# game -> published scores to read the six-game table against: the paper's Table 3 (best
# scores, 0.5-4 h on 64 nodes) and PPO after 40M frames (Schulman et al. 2017, Table 6).
PUBLISHED: dict[str, dict[str, float]] = {
    "Breakout": {"paper": 350.0, "ppo_40m": 274.8},
    "Boxing": {"paper": 98.0, "ppo_40m": 94.6},
    "Pong": {"paper": 20.0, "ppo_40m": 20.7},
    "Seaquest": {"paper": 1832.0, "ppo_40m": 1204.0},
    "SpaceInvaders": {"paper": 650.0, "ppo_40m": 942.5},
    "BeamRider": {"paper": 14900.0, "ppo_40m": 1590.0},
}

# game -> (action, score): the best of the game's actions held for a whole game, what a policy
# that learns nothing scores under ddrl's evaluation protocol (10 games, up to 30 no-op starts,
# epsilon 0.01, the 108,000-frame cap; Pong's recipe greedy). It is above random play in
# Beam Rider (1.8 times), Space Invaders and Seaquest: `ddrl bench policies`,
# docs/results/six-games.md ("The scores to beat").
HELD: dict[str, tuple[str, float]] = {
    "Breakout": ("LEFT", 1.8),
    "Boxing": ("UPFIRE", -23.0),
    "Pong": ("NOOP", -21.0),
    "Seaquest": ("DOWNRIGHTFIRE", 180.0),
    "SpaceInvaders": ("RIGHTFIRE", 322.0),
    "BeamRider": ("LEFTFIRE", 828.0),
}


def reference_scores(game: str) -> dict[str, float]:
    """The scores a game's results are read against (random play, the best held action, the
    paper's, PPO's at 40M frames); NaN where none is known."""
    published = PUBLISHED.get(game, {})
    return {"random": BASELINES.get(game, (math.nan,))[0],
            "held": HELD.get(game, ("", math.nan))[1],
            "paper": published.get("paper", math.nan),
            "ppo_40m": published.get("ppo_40m", math.nan)}


def human_normalized(score: float, game: str) -> float:
    """(score - random) / (human - random); NaN for games without published baselines."""
    if game not in BASELINES:
        return math.nan
    random, human = BASELINES[game]
    return (score - random) / (human - random)


def resolve_target(run: Run, target: float | None) -> float | None:
    """An explicit target wins over the run's own `eval.target`."""
    return target if target is not None else run.setting("eval.target")


def first_reaching(evals: pd.DataFrame, target: float) -> pd.Series | None:
    """The first /eval row (in the order of the weights' updates) whose mean return is at or
    above the target."""
    hits = evals[evals["mean_return"] >= target]
    return None if hits.empty else hits.iloc[0]


def to_target(run: Run, target: float | None) -> tuple[float, float]:
    """(wall seconds, frames) at which the run first reached the target; NaN when it did not."""
    target = resolve_target(run, target)
    row = None if target is None else first_reaching(run["eval"], target)
    if row is None:
        return math.nan, math.nan
    return float(row["wall_time"]), float(row["frames"])


def first_confirmed(run: Run, target: float | None) -> pd.Series | None:
    """The first /eval row at the target over `eval.confirm_episodes` games or more (any row
    where the run did not confirm)."""
    goal = resolve_target(run, target)
    if goal is None:
        return None
    evals = run["eval"]
    return first_reaching(evals[evals["episodes"] >= int(run.setting("eval.confirm_episodes") or 0)],
                          goal)


def to_confirmed_target(run: Run, target: float | None) -> tuple[float, float]:
    """As `to_target`, counting only evaluations over eval.confirm_episodes games or more (a
    crossing's confirmation holds all of its games); a run from before confirmations counts
    every evaluation."""
    row = first_confirmed(run, target)
    return (math.nan, math.nan) if row is None else (float(row["wall_time"]), float(row["frames"]))


def detection_lag(run: Run, target: float | None) -> float:
    """Seconds from taking the weights that confirmed the target to knowing it (the run's
    stop); NaN without a confirmed target or in a log from before `known_at`."""
    row = first_confirmed(run, target)
    if row is None or not row.get("known_at", 0.0):
        return math.nan
    return float(row["known_at"] - row["wall_time"])


def _evaluations(run: Run, wall_time: float, ended_by: bool) -> list[pd.DataFrame]:
    """The run's evaluation rows (cut ones too); `ended_by`: only those that had ended by
    `wall_time`, the share of the training that led to a target's weights, without the
    evaluation and confirmation that then found them (the detection lag's)."""
    tables = []
    for name in ("eval", "eval_cut"):
        t = run.tables.get(name)
        if t is None or not len(t):
            continue
        if ended_by:
            end = t["wall_time"] + t["seconds"]
            if "known_at" in t:
                # Logs before `known_at` hold 0 there.
                end = t["known_at"].where(t["known_at"] > 0, end)
            t = t[end <= wall_time]
        tables.append(t)
    return tables


def eval_share(run: Run, wall_time: float, ended_by: bool = False) -> float:
    """The evaluator's CPU seconds (cut evaluations' too) over the job's core-seconds of the
    run's first `wall_time` seconds (`ended_by`: as `_evaluations`)."""
    cores = run.attrs.get("cores")
    if not cores or not wall_time or math.isnan(wall_time):
        return math.nan
    return sum(float(t["cpu_seconds"].sum())
               for t in _evaluations(run, wall_time, ended_by)) / (wall_time * cores)


def held_share(run: Run, wall_time: float, ended_by: bool = False) -> float:
    """The seconds the ranks waited for evaluations (focused ones, confirmations) over the
    run's first `wall_time` seconds (`ended_by`: as `_evaluations`): what evaluation cost a
    synchronous job's frames/s; NaN for a log from before `/eval` recorded it (format 10)."""
    logged = any("held" in run.tables.get(n, ()) for n in ("eval", "eval_cut"))
    if not wall_time or math.isnan(wall_time) or not logged:
        return math.nan
    return sum(float(t["held"].sum()) for t in _evaluations(run, wall_time, ended_by)
               if "held" in t) / wall_time


def to_online_target(run: Run, target: float | None, games: int = 100) -> tuple[float, float]:
    """(wall seconds, frames) at which the mean of the last `games` training games first
    reached the target: the protocol of the published PPO and A2C curves (CleanRL, RLlib)."""
    goal = resolve_target(run, target)
    episodes = run["episodes"].sort_values("frames", kind="stable")
    if goal is None or len(episodes) < games:
        return math.nan, math.nan
    mean = episodes["return"].rolling(games).mean()
    hits = episodes[mean >= goal]
    return (math.nan, math.nan) if hits.empty else (float(hits["wall_time"].iloc[0]),
                                                    float(hits["frames"].iloc[0]))


def median_bound(frames: pd.Series, reached: pd.Series) -> tuple[float, bool]:
    """(median, exact): a run that did not reach the target did so past its budget, anywhere
    from there on. The median is then at least the median with each such run at its budget,
    and exact only when it is the same with them at infinity (a budget below another run's
    hit leaves the order, so the median, open)."""
    f, hit = frames.to_numpy(dtype=float), reached.to_numpy(dtype=bool)
    low = float(np.median(f))
    return low, low == float(np.median(np.where(hit, f, np.inf)))
