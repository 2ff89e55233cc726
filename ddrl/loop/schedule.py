"""Which weights rank 0's evaluator plays, and when: the newest due ones while the run trains,
a confirmation for a crossing, and after the run the weights it had no time for, so that the
time to target is the one an evaluation every eval.every updates would have found.

Invariants (tests/unit/test_eval_schedule.py):
- `skipped`: weights due while the evaluator played, since its last start, in update order;
- `gap`: all those skipped before the last evaluation started, whatever the evaluations
  between them scored (a noisy score below the target says nothing certain of earlier
  weights); after a hit, those before the hit (no evaluation starts after one);
- together at most SKIPPED_BYTES of weights, the oldest dropped first;
- a crossing counts once the same weights have played eval.confirm_episodes games in all;
- the ranks wait for one evaluation at most its hold limit (eval.pause_limit), then it plays on
  in the background; the pause share is charged the waits, not the evaluations' lengths;
- below eval.full_share_above, focused waits stay within FAR_SHARE of the pause share;
- a near miss (eval.near_miss) lets the next due evaluation past the share, uncharged, once:
  one that played so grants no other.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ddrl.config import EvalConfig
from ddrl.loop.evaluator import EvalDone, EvalResult, Snapshot
from ddrl.output import say

SKIPPED_BYTES = 256 << 20
# The next focused evaluation is expected to hold the ranks the median of this many last waits:
# one long wait (a released evaluation) would otherwise keep the next from starting for
# that wait / eval.pause_share.
RECENT_WAITS = 5
# The part of eval.pause_share focused evaluations may wait for below eval.full_share_above.
FAR_SHARE = 0.5


class Evaluator(Protocol):
    """What the schedule needs of an evaluator (loop/evaluator.py's BackgroundEvaluator)."""

    @property
    def busy(self) -> bool: ...

    @property
    def playing(self) -> Snapshot | None: ...

    def within_budget(self) -> bool: ...

    def start(self, snapshot: Snapshot) -> None: ...

    def poll(self, wait: bool = False, stop: threading.Event | None = None) -> EvalDone | None: ...

    def siblings(self, most: int) -> list[Evaluator]: ...

    def cancel(self) -> None: ...


def reaches(res: EvalResult, target: float | None) -> bool:
    """Whether an evaluation's games are at the target. A cut one's mean is over the games
    that ended first, and the games still going, which it stopped on, could not have
    brought all of them there: it reaches nothing, whatever that mean."""
    return target is not None and not res.cut and res.mean >= target


def near_miss(cfg: EvalConfig, res: EvalResult) -> bool:
    """Whether a cut evaluation's games that ended, half of those it set out to play or more
    (a confirmation: of eval.confirm_episodes), averaged at the target: a game or two kept
    weights near it from the target (eval.near_miss)."""
    planned = cfg.episodes if res.episodes <= cfg.episodes else cfg.confirm_episodes
    return cfg.near_miss and cfg.target is not None and res.cut \
        and 2 * res.episodes >= planned and res.mean >= cfg.target


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds))


class EvalSchedule:
    """`record(done, newest, held)` is called with every finished evaluation, in the order they
    end (`newest`: not a backfilled one; `held`: the seconds the ranks waited for it);
    `clock()` is the run's wall time."""

    def __init__(self, cfg: EvalConfig, evaluator: Evaluator | None,
                 record: Callable[[EvalDone, bool, float], None], clock: Callable[[], float],
                 mark: int = 0, kept: list[Snapshot] | None = None, best: float | None = None,
                 can_pause: bool = False, hold_most: float = float("inf"),
                 reached: bool = False, waits: list[float] | None = None):
        self.cfg, self.evaluator, self._record, self._clock = cfg, evaluator, record, clock
        self.mark = mark  # the update of the last evaluation started
        # Whether the ranks can wait for an evaluation (synchronous placements), and whether
        # they do for every due one from now on (eval.focus_above reached).
        self._can_pause = can_pause
        # `best`: the highest mean of a resumed run's evaluations so far (cut ones too, as
        # `finished` takes them); one that had focused stays so.
        self.focused = can_pause and None not in (best, cfg.focus_above) \
            and best >= cfg.focus_above
        # Whether focused evaluations may wait for the whole pause share (eval.full_share_above).
        self.near = cfg.full_share_above is None or best is not None \
            and best >= cfg.full_share_above
        # Seconds the ranks waited for focused evaluations (eval.pause_share bounds their sum,
        # over a resumed run's `waits` too), the last ones' (the next waits about their median).
        self.waited, self._waits = 0.0, deque(maxlen=RECENT_WAITS)
        for seconds in waits or ():
            self._waited(seconds)
        # Waits up to a release, recorded when the evaluation ends: update -> seconds.
        self._released: dict[int, float] = {}
        # No hold past it, whatever eval.pause_limit says: the other ranks' barrier gives up at
        # sync.timeout. Since when the ranks have held for the evaluation playing.
        self._hold_most, self._held_since = hold_most, 0.0
        # `reached`: a resumed run's target was confirmed before the stop (which cut the owed
        # evaluations short): it trains no further and plays the weights it still owes. A
        # crossing the stop left unconfirmed is no hit: the run trains on.
        self.target_reached = reached
        self.skipped: list[Snapshot] = [] if reached else list(kept or [])
        self.gap: list[Snapshot] = list(kept or []) if reached else []
        self.dropped = 0  # kept weights dropped for the SKIPPED_BYTES cap, since this start
        # A near miss seen: the next due evaluation need not wait for the share. The updates
        # of those that played past it: their waits are not charged, their near misses (their
        # confirmations' too) grant no other.
        self._near_miss, self._uncharged = False, set()

    def due(self, update: int, snapshot: Callable[[], Snapshot]) -> None:
        """At each eval.every-th update, or at the first after it when the evaluator was still
        playing or over its CPU share then: the newest weights first, so the run follows its
        progress. With a target, the weights due meanwhile are kept for `play_owed`: the
        evaluator's pace (a nice-19 evaluator takes minutes per evaluation of long games)
        delays the run's end, not its time to target. Once focused, a due evaluation waits
        for the pause budget instead of playing in the background: a nice-19 one takes
        minutes and would hold back the next focused one, so a crossing would be known at
        the background's pace."""
        ev, every = self.evaluator, self.cfg.every
        if ev is None or not self.cfg.episodes or self.target_reached \
                or update // every <= self.mark // every:
            return
        expected = statistics.median(self._waits) if self._waits else 0.0
        share = self.cfg.pause_share * (1.0 if self.near else FAR_SHARE)
        within = self.waited + expected <= share * self._clock()
        pause = self.focused and (within or self._near_miss)
        if not ev.busy and (pause or not self.focused and ev.within_budget()):
            snap = snapshot()
            snap.paused = pause
            if pause and not within:
                self._uncharged.add(update)
            self._near_miss = False
            self._start(snap)
            self.gap, self.skipped = [*self.gap, *self.skipped], []
            self.mark = update
            return
        last_kept = self.skipped[-1].update if self.skipped else self.mark
        if self.cfg.target is not None and self.cfg.backfill \
                and update // every > last_kept // every:
            self.skipped.append(snapshot())
            over = len(self.gap) + len(self.skipped) - max(
                1, SKIPPED_BYTES // self.skipped[-1].weights.nbytes)
            if over > 0:
                self._drop(over)

    def _start(self, snap: Snapshot) -> None:
        self.evaluator.start(snap)
        if snap.paused:
            self._held_since = self._clock()

    def _release(self) -> None:
        """A paused evaluation past its hold limit plays on in the background and the ranks
        train on: charged the wait, not its length (a confirmation, not at all)."""
        snap = self.evaluator.playing
        if snap is None or not snap.paused:
            return
        games = snap.episodes or self.cfg.episodes
        limit = min(self.cfg.pause_limit * max(1.0, games / max(self.cfg.episodes, 1)),
                    self._hold_most)
        held = self._clock() - self._held_since
        if held <= limit:
            return
        snap.paused = False
        self._released[snap.update] = held
        if snap.prior is None:
            self._charge(snap.update, held)
        say(f"[ddrl] warning: the evaluation of update {snap.update} held the ranks "
            f"{held:.0f} s (eval.pause_limit {self.cfg.pause_limit:g} s for "
            f"{self.cfg.episodes} games): it plays on in the background, the ranks train on",
            err=True)

    def _charge(self, update: int, seconds: float) -> None:
        """The share charged a wait for the evaluation of `update`, unless a near miss let it
        play past the share."""
        if update not in self._uncharged:
            self._waited(seconds)

    def _waited(self, seconds: float) -> None:
        self.waited += seconds
        self._waits.append(seconds)

    def _drop(self, count: int) -> None:
        """The oldest kept weights, with a warning the first time: an owed evaluation among
        them could have been the earliest to reach the target."""
        if not self.dropped:
            say(f"[ddrl] warning: the weights kept for evaluations the evaluator had no time "
                f"for pass {SKIPPED_BYTES >> 20} MiB; the oldest are dropped from now on (the "
                f"/train column owed_dropped counts them), so the time to target may be found "
                f"later than it was reached: give the evaluator more CPU (eval.nice, "
                f"eval.cpu_share) or evaluate less often (eval.every)", err=True)
        self.dropped += count
        from_gap = min(count, len(self.gap))
        del self.gap[:from_gap]
        del self.skipped[:count - from_gap]

    @property
    def pausing(self) -> bool:
        """Whether the evaluator plays what the ranks wait for: a crossing's confirmation
        (eval.pause_to_confirm) or, once focused, any evaluation."""
        playing = self.evaluator.playing if self.evaluator is not None else None
        return playing is not None and playing.paused

    def unplayed(self) -> list[Snapshot]:
        """The weights due and not yet scored: those skipped before the last evaluation, its
        own while it plays, those skipped since; after a hit, those skipped before it (the
        later ones cannot come before it)."""
        if self.cfg.target is None or not self.cfg.backfill:
            return []
        if self.target_reached:
            return list(self.gap)
        playing = self.evaluator.playing if self.evaluator is not None else None
        return [*self.gap, *([playing] if playing else []), *self.skipped]

    def poll(self, wait: bool, stop: threading.Event | None = None) -> None:
        """A finished evaluation recorded; one that crossed the target goes on at once with its
        confirmation (waited for too, with `wait`)."""
        while self.evaluator is not None:
            self._release()
            done = self.evaluator.poll(wait=wait, stop=stop)
            if done is None:
                return
            self.finished(done)
            confirm = self.confirmation(done)
            if confirm is None:
                return
            self._start(confirm)
            if not wait:
                return

    def confirmation(self, done: EvalDone) -> Snapshot | None:
        """The games still owed by weights whose evaluation crossed the target, before the
        crossing counts (eval.confirm_episodes in all); None when there are none."""
        target, res, needed = self.cfg.target, done.result, self.cfg.confirm_episodes
        if not reaches(res, target) or res.episodes >= needed:
            return None
        return Snapshot(done.weights, done.update, done.frames, done.wall_time, prior=res,
                        episodes=needed - res.episodes,
                        paused=self._can_pause and self.cfg.pause_to_confirm)

    def finished(self, done: EvalDone) -> None:
        """`done` recorded; the target reached when it is confirmed."""
        newest = done.update >= self.mark
        held = self._released.pop(done.update, 0.0)
        if done.paused:
            held = done.seconds
            if done.result.episodes <= self.cfg.episodes:  # not a confirmation: charged
                self._charge(done.update, held)
        self._record(done, newest, held)
        target, res = self.cfg.target, done.result
        focus = self.cfg.focus_above
        if newest and self._can_pause and focus is not None and res.mean >= focus \
                and not self.focused:
            self.focused = True
            say(f"[ddrl] evaluation of update {done.update} scored {res.mean:.1f} (eval."
                f"focus_above {focus:g}): the ranks wait for each evaluation from now on")
        near = self.cfg.full_share_above
        if newest and not self.near and res.mean >= near:
            self.near = True
            say(f"[ddrl] evaluation of update {done.update} scored {res.mean:.1f} (eval."
                f"full_share_above {near:g}): focused evaluations may wait for all of "
                f"eval.pause_share from now on")
        if newest and self.focused and near_miss(self.cfg, res) \
                and done.update not in self._uncharged:
            self._near_miss = True
            say(f"[ddrl] evaluation of update {done.update}: {res.episodes} games ended at "
                f"{res.mean:.1f} before it was cut (eval.near_miss): the next due one is "
                f"waited for at once, even past eval.pause_share")
        if not reaches(res, target) or self.confirmation(done) is not None \
                or self.target_reached:
            return
        self.target_reached = True
        now = self._clock()
        say(f"[ddrl] target {target:g} reached: the weights of update {done.update} "
            f"({done.frames:,} frames, {_clock(done.wall_time)}) scored {res.mean:.1f} over "
            f"{res.episodes} games; known at {_clock(now)}, "
            f"{max(now - done.wall_time, 0.0):.0f} s after they were taken")

    def play_owed(self, stop: threading.Event, on_budget: bool) -> list[Snapshot] | None:
        """The weights due and not yet scored, oldest first, until one reaches the target (the
        run is over: the evaluator has the cores, and as many evaluator processes as there are
        cores play side by side). After a hit, those skipped before the evaluation that hit;
        after a run that used its budget without a hit, all it kept. Each is recorded with its
        own update, frames and wall time, after the run's rows. Returns those still owed (a
        stop signal, a worker that died), or None when none were played."""
        if not self.cfg.backfill:
            return None
        if self.target_reached:
            owed, why = self.gap, "target reached; evaluating the weights skipped before the " \
                "ones that reached it"
        elif on_budget:  # without a target nothing is kept: the lists are empty
            owed, why = [*self.gap, *self.skipped], "target not reached; evaluating the " \
                "weights the evaluator had no time for"
        else:
            return None
        if not owed:
            return None
        workers = [self.evaluator, *self.evaluator.siblings(len(owed) - 1)]
        say(f"[ddrl] {why} ({len(owed)}, updates {owed[0].update}-{owed[-1].update}), oldest "
            f"first, until one reaches it; {len(workers)} evaluator process(es)")
        left = self.play_in_order(owed, workers, stop)
        for worker in workers[1:]:
            worker.cancel()
        return left

    def play_in_order(self, owed: list[Snapshot], workers: list[Evaluator],
                      stop: threading.Event) -> list[Snapshot]:
        """`owed` played in order on `workers`, each starting the next when free, until the
        earliest to reach the target is known: all before it played, none after it started
        (those after it still playing are abandoned). Those still owed: unplayed before the
        first hit (a stop, a worker that died)."""
        playing: dict[int, Evaluator] = {}
        finished: set[int] = set()
        hit, upcoming = len(owed), 0  # hit: the earliest index known to reach the target
        while not stop.is_set():
            for worker in workers:
                if not worker.busy and upcoming < hit:
                    worker.start(owed[upcoming])
                    playing[upcoming] = worker
                    upcoming += 1
            if not playing:
                break
            progressed = False
            for i, worker in list(playing.items()):
                done = worker.poll()
                if done is None and worker.busy:
                    continue
                del playing[i]
                progressed = True
                if done is None:  # its worker died (a warning said so): none starts after it
                    upcoming = len(owed)
                    continue
                if i < hit:
                    self.finished(done)
                    finished.add(i)
                    confirm = self.confirmation(done)
                    if confirm is not None:  # the same worker plays the rest of the games
                        worker.start(confirm)
                        playing[i] = worker
                    elif reaches(done.result, self.cfg.target):
                        hit = i
            for i in [i for i in playing if i > hit]:
                playing.pop(i).cancel()
            if not progressed:
                time.sleep(0.05)
        for worker in playing.values():
            worker.cancel()
        return [snap for i, snap in enumerate(owed[:hit]) if i not in finished]
