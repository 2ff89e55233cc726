"""The one-line console progress report of rank 0."""
from __future__ import annotations

import time
from typing import Callable

from ddrl.output import say


def _hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """The rate is measured over the frames of this process only: a resumed run starts from
    its checkpoint's frame count, not from 0. Periodic lines give the rate since the last
    line that had new frames (PPO's frames arrive a rollout at a time, between many updates:
    lines without new frames repeat the last rate); the final line (`final=True`) the mean
    since the (re)start, since the stretch before it holds the last evaluation and checkpoint
    and few frames."""

    def __init__(self, every_seconds: float, max_frames: int, max_minutes: float,
                 start_frames: int = 0, clock: Callable[[], float] = time.monotonic):
        self._every = every_seconds
        self._max_frames = max_frames
        self._max_seconds = max_minutes * 60
        self._clock = clock
        self._printed = self._last = self._start = clock()
        self._last_frames = self._start_frames = start_frames
        self._rate = 0.0
        self.online: list[float] = []
        # The newest evaluation's mean; a cut one's (stopped out of reach of the target) is
        # shown too, marked, since a run far from its target may cut every evaluation.
        self.eval_score: float | None = None
        self.eval_cut = False

    def maybe_print(self, frames: int, elapsed: float, update: int, final: bool = False) -> None:
        now = self._clock()
        if not final and now - self._printed < self._every:
            return
        self._printed = now
        if frames != self._last_frames:
            self._rate = (frames - self._last_frames) / max(now - self._last, 1e-9)
            self._last, self._last_frames = now, frames
        rate = (frames - self._start_frames) / max(now - self._start, 1e-9) if final \
            else self._rate
        left = (self._max_frames - frames) / rate if rate > 0 else float("inf")
        if self._max_seconds:
            left = min(left, self._max_seconds - elapsed)
        recent = self.online[-20:]
        online = f"{sum(recent) / len(recent):.1f}" if recent else "-"
        score = "-" if self.eval_score is None else \
            f"{self.eval_score:.1f}{' (cut)' if self.eval_cut else ''}"
        left_text = _hms(left) if left != float("inf") else "?"
        say(f"[ddrl] update {update}  frames {frames:,}  {rate:,.0f} frames/s  "
            f"online {online}  eval {score}  elapsed {_hms(elapsed)}  left {left_text}")
