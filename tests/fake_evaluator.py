"""An evaluator whose scores and durations a test sets, for the loop's and the evaluation
schedule's tests (what BackgroundEvaluator offers, without processes or games)."""
from __future__ import annotations

from dataclasses import replace

from ddrl.loop.evaluator import EvalDone, EvalResult, Snapshot, pooled


class FakeEvaluator:
    """Scores the weights of update u `score(u)`, read at the `polls`-th poll after the start
    (one poll an update; `polls` may be a function of u), or at once by a poll that waits."""

    def __init__(self, score, polls: int = 1, processes: int = 1,
                 started: list[int] | None = None, confirm_score=None):
        self._score, self._polls, self._processes = score, polls, processes
        # What a confirmation's further games score (by default what the first ones did).
        self._confirm_score = confirm_score or score
        self._done: EvalDone | None = None
        self._left = 0
        self.started: list[int] = [] if started is None else started  # all siblings' starts
        self.seconds = 0.0  # the wall time each evaluation reports
        self.cut_below = float("-inf")  # scores below it are cut (out of reach of the target)
        # Updates whose first games are cut whatever they score: the mean of the games that
        # ended before the cut may be above the target.
        self.cut_updates: set[int] = set()
        self.cut_games = 10  # the games of a cut evaluation that ended: its mean is theirs

    def siblings(self, most: int) -> list[FakeEvaluator]:
        return [FakeEvaluator(self._score, self._polls, 1, self.started)
                for _ in range(min(most, self._processes - 1))]

    @property
    def busy(self) -> bool:
        return self._done is not None

    @property
    def playing(self) -> Snapshot | None:
        return self._snap if self._done is not None else None

    def start(self, snap) -> None:
        self._snap = snap
        self.started.append(snap.update)
        score = (self._score if snap.prior is None else self._confirm_score)(snap.update)
        cut = score < self.cut_below or snap.prior is None and snap.update in self.cut_updates
        games = self.cut_games if cut and snap.prior is None else snap.episodes or 10
        result = EvalResult(score, 0.0, score, games, cut=cut)
        if snap.prior is not None:  # a confirmation: the same weights, more games
            result = pooled(snap.prior, result)
        self._done = EvalDone(snap.update, snap.frames, snap.wall_time, result, snap.weights,
                              seconds=self.seconds, paused=snap.paused)
        self._left = self._polls(snap.update) if callable(self._polls) else self._polls

    def within_budget(self) -> bool:
        return True

    def poll(self, wait: bool = False, stop=None) -> EvalDone | None:
        self._left -= 1
        if self._left > 0 and not wait:
            return None
        out, self._done = self._done, None
        # As BackgroundEvaluator: paused as the evaluation ends (a released one is not).
        return out and replace(out, paused=self._snap.paused)

    def cancel(self) -> None:
        self._done = None
