"""The evaluation schedule's invariants (ddrl/loop/schedule.py), driven update by update with an
evaluator whose scores and durations the test sets."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from fake_evaluator import FakeEvaluator

from ddrl.config import EvalConfig
from ddrl.loop.evaluator import Snapshot
from ddrl.loop.schedule import SKIPPED_BYTES, EvalSchedule


def snap(update: int, size: int = 4) -> Snapshot:
    return Snapshot(np.zeros(size, np.float32), update, update * 100, float(update))


def drive(schedule: EvalSchedule, updates: range, size: int = 4) -> None:
    """What the trainer does after each update."""
    for u in updates:
        schedule.poll(wait=False)
        schedule.due(u, lambda u=u: snap(u, size))


def make(score, polls=1, confirm=0, target=18.0, every=2, confirm_score=None,
         can_pause=True, **settings):
    recorded: list[tuple[int, float, int, bool]] = []
    evaluator = FakeEvaluator(score, polls, confirm_score=confirm_score)
    schedule = EvalSchedule(
        EvalConfig(every=every, episodes=10, target=target, confirm_episodes=confirm, **settings),
        evaluator,
        lambda done, newest, held: recorded.append(
            (done.update, done.result.mean, done.result.episodes, newest)),
        clock=lambda: 0.0, can_pause=can_pause)
    return schedule, evaluator, recorded


def test_an_idle_evaluator_plays_every_due_update_and_nothing_is_owed():
    schedule, evaluator, recorded = make(lambda u: 0.0)
    drive(schedule, range(1, 11))
    assert evaluator.started == [2, 4, 6, 8, 10]
    assert [r[0] for r in recorded] == [2, 4, 6, 8]
    assert schedule.gap == [] and schedule.skipped == []


def test_weights_due_while_it_plays_are_kept_in_order_and_move_to_the_gap_at_the_next_start():
    schedule, evaluator, _ = make(lambda u: 0.0, polls=5)
    drive(schedule, range(1, 9))
    # 2 ends at update 7's poll, and 7 (the newest) starts at once; 4 and 6 were due meanwhile.
    assert evaluator.started == [2, 7]
    assert [s.update for s in schedule.gap] == [4, 6] and [s.update for s in schedule.skipped] == [8]
    assert [s.update for s in schedule.unplayed()] == [4, 6, 7, 8]


def test_without_a_target_nothing_is_kept():
    schedule, evaluator, _ = make(lambda u: 0.0, polls=5, target=None)
    drive(schedule, range(1, 12))
    assert schedule.gap == schedule.skipped == schedule.unplayed() == []


def test_kept_weights_are_capped_in_bytes_oldest_first_with_one_warning(capsys):
    size = SKIPPED_BYTES // 4 // 3  # three snapshots fit
    schedule, evaluator, _ = make(lambda u: 0.0, polls=10 ** 6)
    drive(schedule, range(1, 13), size)
    assert [s.update for s in schedule.skipped] == [8, 10, 12] and schedule.dropped == 2
    assert capsys.readouterr().err.count("warning: the weights kept for evaluations") == 1


def test_a_crossing_counts_only_after_its_confirmation_over_all_the_games():
    schedule, evaluator, recorded = make(lambda u: 20.0 if u == 4 else 0.0, confirm=50)
    drive(schedule, range(1, 8))
    assert (4, 20.0, 50, True) in recorded and schedule.target_reached
    assert evaluator.started == [2, 4, 4]  # none after the hit


def test_a_crossing_that_fails_its_confirmation_does_not_count_and_the_run_goes_on():
    # The further games of update 4 score 0: 10 games at 20 and 40 at 0, a mean of 4.
    schedule, evaluator, recorded = make(lambda u: 20.0 if u == 4 else 0.0, confirm=50,
                                         confirm_score=lambda u: 0.0)
    drive(schedule, range(1, 10))
    assert (4, 4.0, 50, True) in recorded and not schedule.target_reached
    assert evaluator.started == [2, 4, 4, 6, 8]


@pytest.mark.parametrize("confirm", [0, 50])
def test_a_cut_evaluation_reaches_nothing_whatever_its_ended_games_scored(confirm):
    # Update 4's games that ended before the cut averaged 20; those still going could not have
    # brought all 10 to 18. No confirmation of it is played, and it is no hit.
    schedule, evaluator, _ = make(lambda u: 20.0 if u == 4 else 0.0, confirm=confirm)
    evaluator.cut_updates = {4}
    drive(schedule, range(1, 10))
    assert not schedule.target_reached
    assert evaluator.started == [2, 4, 6, 8]


def test_weights_owed_after_the_run_skip_a_cut_evaluation_for_the_next_hit():
    schedule, evaluator, _ = make(lambda u: 20.0 if u >= 4 else 0.0)
    evaluator.cut_updates = {4}
    left = schedule.play_in_order([snap(2), snap(4), snap(6)], [evaluator], threading.Event())
    assert left == [] and evaluator.started == [2, 4, 6] and schedule.target_reached


def test_after_a_hit_the_gap_is_played_oldest_first_and_stops_at_the_earliest_hit():
    schedule, evaluator, recorded = make(lambda u: 20.0 if u >= 6 else 0.0, polls=5)
    drive(schedule, range(1, 17))
    assert schedule.target_reached
    # 7 hit; 4 and 6 were skipped before it started (8-12 after: they cannot come first).
    assert [s.update for s in schedule.gap] == [4, 6] and schedule.unplayed() == schedule.gap
    left = schedule.play_owed(threading.Event(), on_budget=False)
    assert left == [] and [r[0] for r in recorded] == [2, 7, 4, 6]


def test_a_run_resumed_after_its_hit_trains_no_further_and_owes_its_kept_weights():
    schedule = EvalSchedule(EvalConfig(every=2, episodes=10, target=18.0), FakeEvaluator(lambda u: 0),
                            lambda done, newest, held: None, lambda: 0.0, mark=10,
                            kept=[snap(4), snap(6)], best=18.5, reached=True)
    assert schedule.target_reached and [s.update for s in schedule.unplayed()] == [4, 6]


def test_a_run_resumed_after_a_crossing_it_did_not_confirm_trains_on():
    """The stop (a time budget) came between a crossing's 10 games and its confirmation: its
    best score is at the target, but nothing was confirmed (the old code stopped the resumed
    run at once as "target")."""
    schedule = EvalSchedule(EvalConfig(every=2, episodes=10, target=18.0), FakeEvaluator(lambda u: 0),
                            lambda done, newest, held: None, lambda: 0.0, mark=10,
                            kept=[snap(4), snap(6)], best=21.0)
    assert not schedule.target_reached
    schedule.due(12, lambda: snap(12))
    assert schedule.mark == 12  # the due evaluation of 12 started: the run trains on


def test_it_says_when_the_evaluator_plays_a_confirmation():
    schedule, evaluator, _ = make(lambda u: 20.0 if u == 4 else 0.0, polls=2, confirm=50)
    seen = []
    for u in range(1, 9):
        schedule.poll(wait=False)
        schedule.due(u, lambda u=u: snap(u))
        seen.append(schedule.pausing)
    # 4's 10 games end at update 6's poll, its 40 more at update 8's.
    assert seen == [False, False, False, False, False, True, True, False]


def test_once_an_evaluation_reaches_focus_above_every_later_one_is_waited_for():
    """Update u's weights score 2u - 4: the evaluation of 6 reaches 5 (eval.focus_above), known
    as 8 is due; from then on the ranks wait for every due evaluation."""
    schedule, evaluator, _ = make(lambda u: 2.0 * u - 4, polls=2, focus_above=5.0)
    started = {}
    for u in range(1, 13):
        schedule.poll(wait=False)
        schedule.due(u, lambda u=u: snap(u))
        if schedule.evaluator.playing is not None:
            started[schedule.evaluator.playing.update] = schedule.pausing
    assert schedule.focused
    assert started == {2: False, 4: False, 6: False, 8: True, 10: True, 12: True}


def test_a_placement_that_cannot_wait_never_focuses():
    schedule, _, _ = make(lambda u: 10.0, focus_above=5.0, can_pause=False)
    drive(schedule, range(1, 9))
    assert not schedule.focused and not schedule.pausing


def test_without_backfill_no_weights_are_kept_and_none_owed_after_a_hit():
    """A slow evaluator skips weights; eval.backfill = false keeps none, and after the hit the
    run has nothing to play."""
    schedule, evaluator, _ = make(lambda u: 20.0 if u >= 8 else 0.0, polls=5, backfill=False)
    drive(schedule, range(1, 40))
    assert schedule.target_reached and schedule.skipped == [] and schedule.unplayed() == []
    assert schedule.play_owed(threading.Event(), on_budget=False) is None


def test_focused_waits_stay_within_pause_share_and_the_rest_wait_for_it():
    """Each focused evaluation makes the ranks wait 3 s; at 5 s of wall time an update and
    eval.pause_share 0.1, a due one is waited for only while the waits so far and one more fit
    in a tenth of the run's time: the k-th at 30k s, 10 in the 300 s of 60 updates. One due
    beyond the share starts when the share allows it, with the newest weights, never in the
    background (where it would hold the next focused one back)."""
    now = [0.0]
    evaluator = FakeEvaluator(lambda u: 0.0)
    evaluator.seconds = 3.0
    schedule = EvalSchedule(EvalConfig(every=2, episodes=10, target=18.0, focus_above=-21.0,
                                       pause_share=0.1),
                            evaluator, lambda done, newest, held: None, clock=lambda: now[0],
                            can_pause=True)
    waited = []
    for u in range(1, 61):
        now[0] = 5.0 * u
        schedule.poll(wait=False)
        schedule.due(u, lambda u=u: snap(u))
        if schedule.pausing:
            waited.append(u)
    assert schedule.focused
    assert schedule.waited <= 0.1 * now[0] and len(waited) == 10, (schedule.waited, waited)
    # The first (before it focused) in the background, then each as soon as the share allows.
    assert evaluator.started == [2, 4, 12, 18, 24, 30, 36, 42, 48, 54, 60]


def focused(evaluator: FakeEvaluator, now: list[float], hold_most: float = float("inf"),
            **settings) -> EvalSchedule:
    """Focused from the start (a resumed run's best at eval.focus_above), an evaluation due
    every update; `now[0]` is the run's clock."""
    return EvalSchedule(EvalConfig(every=1, episodes=10, target=18.0, focus_above=-21.0,
                                   **settings),
                        evaluator, lambda done, newest, held: None, clock=lambda: now[0],
                        best=-21.0, can_pause=True, hold_most=hold_most)


@pytest.mark.parametrize("limit, hold_most", [(30.0, float("inf")), (30.0, 12.0)])
def test_a_focused_evaluation_past_its_hold_limit_plays_on_in_the_background(
        capsys, limit, hold_most):
    """An evaluation that holds the ranks past eval.pause_limit (or the trainer's own bound,
    half of sync.timeout) goes on in the background: the ranks no longer wait, and the pause
    share is charged the wait only."""
    now = [0.0]
    evaluator = FakeEvaluator(lambda u: 0.0, polls=10 ** 6)
    schedule = focused(evaluator, now, hold_most, pause_limit=limit)
    schedule.due(1, lambda: snap(1))
    bound = min(limit, hold_most)
    now[0] = bound - 1
    schedule.poll(wait=False)
    assert schedule.pausing
    now[0] = bound + 1
    schedule.poll(wait=False)
    assert not schedule.pausing and evaluator.busy
    assert schedule.waited == bound + 1
    assert f"the evaluation of update 1 held the ranks {bound + 1:.0f} s" in capsys.readouterr().err


def test_a_confirmation_holds_the_ranks_longer_for_its_games_and_is_not_charged():
    """A crossing's 40 further games may hold the ranks 4 x eval.pause_limit; released
    after that, they still play, and the pause share is not charged for them."""
    now, polls = [0.0], iter([1, 10 ** 6])
    evaluator = FakeEvaluator(lambda u: 20.0, polls=lambda u: next(polls))
    schedule = focused(evaluator, now, pause_limit=30.0, confirm_episodes=50)
    schedule.due(1, lambda: snap(1))
    schedule.poll(wait=False)  # the 10 games end at 20: the confirmation starts
    assert evaluator.playing.prior is not None and schedule.pausing
    now[0] = 119.0
    schedule.poll(wait=False)
    assert schedule.pausing
    now[0] = 121.0
    schedule.poll(wait=False)
    assert not schedule.pausing and evaluator.busy and schedule.waited == 0.0


def test_one_long_wait_does_not_keep_focused_evaluations_from_the_rest_of_the_run():
    """Four waits of 3 s, then one of 30 (eval.pause_share 0.05): the next is expected to
    wait the median of the recent waits, 3 s, so it starts once 42 + 3 s fit in 5% of the
    run (at 900 s), not once 42 + 30 s do (1,440 s)."""
    now = [0.0]
    evaluator = FakeEvaluator(lambda u: 0.0)
    schedule = focused(evaluator, now, pause_share=0.05, pause_limit=60.0)
    for u, seconds in enumerate([3.0, 3.0, 3.0, 3.0, 30.0], start=1):
        now[0] = 100.0 * u
        evaluator.seconds = seconds
        schedule.due(u, lambda u=u: snap(u))
        assert schedule.pausing, u
        schedule.poll(wait=False)
    assert schedule.waited == 42.0
    now[0] = 890.0
    schedule.due(6, lambda: snap(6))
    assert not schedule.pausing
    now[0] = 900.0
    schedule.due(7, lambda: snap(7))
    assert schedule.pausing and evaluator.started[-1] == 7


def test_far_from_the_target_focused_waits_keep_half_the_share_for_those_near_it(capsys):
    """3-s waits, eval.pause_share 0.1, an update every 5 s: while the newest evaluation scores
    -21 (below eval.full_share_above 0) a due one is waited for only within 0.05 of the run's
    time: the first at once (its wait unknown), the k-th at 60k s, 5 in the first 300 s where
    the whole share fits 10. Those at 0
    or more spend what the far ones left: one every update (61-66) until the waits reach
    0.1 of the run's time."""
    now = [0.0]
    evaluator = FakeEvaluator(lambda u: 0.0 if u >= 60 else -21.0)
    evaluator.seconds = 3.0
    schedule = focused(evaluator, now, pause_share=0.1, full_share_above=0.0)
    for u in range(1, 101):
        now[0] = 5.0 * u
        schedule.poll(wait=False)
        schedule.due(u, lambda u=u: snap(u))
    assert evaluator.started[:5] == [1, 24, 36, 48, 60], evaluator.started
    assert schedule.near and "eval.full_share_above 0" in capsys.readouterr().out
    # 15 s waited by 300 s; at 305 s a tenth of the run is 30.5 s.
    assert evaluator.started[5:12] == [61, 62, 63, 64, 65, 66, 72], evaluator.started
    assert schedule.waited <= 0.1 * now[0]


def test_each_evaluation_is_recorded_with_the_wait_it_held_the_ranks():
    """`held`, the /eval column a resumed run's share goes on from: a focused evaluation's
    length; one released past eval.pause_limit its wait until the release; a crossing's
    confirmation its length too, which the share is not charged."""
    now, held = [0.0], []
    evaluator = FakeEvaluator(lambda u: 20.0 if u == 3 else 0.0,
                              polls=lambda u: 10 ** 6 if u == 2 else 1)
    evaluator.seconds = 3.0
    schedule = EvalSchedule(EvalConfig(every=1, episodes=10, target=18.0, focus_above=-21.0,
                                       pause_limit=30.0, confirm_episodes=50),
                            evaluator, lambda done, newest, h: held.append(
                                (done.update, done.result.episodes, h)),
                            clock=lambda: now[0], best=-21.0, can_pause=True)
    schedule.due(1, lambda: snap(1))
    schedule.poll(wait=False)
    now[0] = 1000.0
    schedule.due(2, lambda: snap(2))
    now[0] = 1031.0
    schedule.poll(wait=False)  # released after 31 s
    schedule.poll(wait=True)
    now[0] = 2000.0
    schedule.due(3, lambda: snap(3))
    schedule.poll(wait=True)  # 20 over 10 games, then the confirmation's 40
    assert held == [(1, 10, 3.0), (2, 10, 31.0), (3, 10, 3.0), (3, 50, 3.0)]
    assert schedule.waited == 37.0 and schedule.target_reached


def test_a_resumed_run_goes_on_from_the_waits_it_was_charged():
    """Waits of 3, 3, 3, 3 and 30 s before the stop: at 500 s of run and eval.pause_share
    0.05 (25 s) the share is spent, so a due evaluation does not hold the ranks (the old
    code, its count at 0, held them again for up to the whole share); at 960 s, with the
    next wait expected to be the median, 3 s, it does."""
    now = [500.0]
    evaluator = FakeEvaluator(lambda u: 0.0)
    schedule = EvalSchedule(EvalConfig(every=1, episodes=10, target=18.0, focus_above=-21.0,
                                       pause_share=0.05),
                            evaluator, lambda done, newest, held: None, clock=lambda: now[0],
                            mark=10, best=-21.0, can_pause=True,
                            waits=[3.0, 3.0, 3.0, 3.0, 30.0])
    schedule.due(11, lambda: snap(11))
    assert schedule.waited == 42.0 and not schedule.pausing and not evaluator.busy
    now[0] = 960.0
    schedule.due(12, lambda: snap(12))
    assert schedule.pausing


@pytest.mark.parametrize("near_miss", [True, False])
def test_a_near_miss_lets_the_next_due_evaluation_past_the_spent_share_once(capsys, near_miss):
    """Update 1's evaluation (3 s, charged) is cut with 8 games ended at 19.9: with
    eval.near_miss the next due one is waited for at once though the share (5% of 101 s) is
    spent, and not charged; it is a near miss too, but one that played past the share grants
    no other, so update 3 waits for the share. Without eval.near_miss update 2 waits too."""
    now = [100.0]
    evaluator = FakeEvaluator(lambda u: 19.9)
    evaluator.seconds, evaluator.cut_updates, evaluator.cut_games = 3.0, {1, 2, 3}, 8
    schedule = focused(evaluator, now, pause_share=0.05, near_miss=near_miss)
    for u in (1, 2, 3):
        schedule.due(u, lambda u=u: snap(u))
        schedule.poll(wait=True)
        now[0] += 1.0
    assert evaluator.started == ([1, 2] if near_miss else [1])
    assert schedule.waited == 3.0
    said = capsys.readouterr().out
    assert ("update 1: 8 games ended at 19.9 before it was cut" in said) is near_miss
    assert "update 2: 8 games ended" not in said


def test_a_near_miss_needs_half_the_games_at_the_target():
    """Cut with 4 of 10 games ended at 19.9, or 8 at 17.5: no near miss, the share decides."""
    for games, score in [(4, 19.9), (8, 17.5)]:
        now = [100.0]
        evaluator = FakeEvaluator(lambda u, score=score: score)
        evaluator.seconds, evaluator.cut_updates, evaluator.cut_games = 3.0, {1, 2}, games
        schedule = focused(evaluator, now, pause_share=0.05)
        for u in (1, 2):
            schedule.due(u, lambda u=u: snap(u))
            schedule.poll(wait=True)
            now[0] += 1.0
        assert evaluator.started == [1], (games, score)
