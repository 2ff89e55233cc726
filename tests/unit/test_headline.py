"""The one line `ddrl analyze` prints per run, on each protocol's outcome."""
import math

import pandas as pd

from analysis.summary import headline


def row(**values) -> pd.Series:
    base = {"run": "r", "target": 18.0, "time_to_confirmed": math.nan,
            "frames_to_confirmed": math.nan, "detection_lag": math.nan,
            "time_to_target": math.nan, "frames_to_target": math.nan,
            "time_to_online": math.nan, "frames_to_online": math.nan, "eval_share": 0.063}
    return pd.Series({**base, **values})


def test_a_crossing_never_confirmed_reads_as_not_confirmed():
    line = headline(row(time_to_target=1434.0, frames_to_target=10.0e6))
    assert line == ("r: target 18 not confirmed; first crossing at 23.9 min (10.00M frames); "
                    "online (last 100 training games) not reached; evaluator 6.3% of the CPU")


def test_a_confirmed_target_gives_its_minute_frames_and_lag():
    line = headline(row(time_to_confirmed=960.0, frames_to_confirmed=6.85e6, detection_lag=28.0,
                        time_to_target=960.0, frames_to_target=6.85e6))
    assert line.startswith("r: target 18 confirmed at 16.0 min (6.85M frames), known 28 s later; "
                           "first crossing at 16.0 min")


def test_the_evaluators_share_to_the_confirmed_weights_stands_beside_the_runs():
    line = headline(row(time_to_confirmed=960.0, frames_to_confirmed=6.85e6, detection_lag=28.0,
                        eval_share_to_confirmed=0.03))
    assert line.endswith("; evaluator 6.3% of the CPU (3.0% to the confirmed weights)"), line


def test_a_run_without_target_says_so():
    assert headline(row(target=math.nan)) == "r: no target"


def test_seeds_that_confirmed_nothing_sum_up_without_numpys_warning():
    """`ddrl analyze` over seeds none of which confirmed its target: the medians of what no run
    has are NaN, without numpy's "Mean of empty slice" on the user's terminal."""
    import warnings

    from analysis.summary import over_seeds

    runs = pd.DataFrame([row(last_eval=v, best_eval=v, online_last100=math.nan, frames=1e6,
                             wall_time=60.0, eval_share_to_confirmed=math.nan,
                             eval_share=math.nan) for v in (1.0, 3.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = over_seeds(runs)
    assert stats["final"] == 2.0 and stats["confirmed"] == "0/2"
    assert math.isnan(stats["frames_to_confirmed"]) and math.isnan(stats["minutes_to_target"])


def test_the_ranks_waits_for_evaluations_are_a_share_of_the_run():
    """`/eval`'s `held` over the run's wall time (cut evaluations and confirmations too), the
    frames/s a synchronous job gave its evaluations; a log without the column has none."""
    from types import SimpleNamespace

    from analysis.scores import held_share

    run = SimpleNamespace(tables={"eval": pd.DataFrame({"held": [6.0, 24.0]}),
                                  "eval_cut": pd.DataFrame({"held": [2.0, 0.0, 8.0]})})
    assert held_share(run, 1000.0) == 0.04
    assert math.isnan(held_share(SimpleNamespace(tables={"eval": pd.DataFrame({"seconds": [9.0]})}),
                                 1000.0))
    line = headline(row(held_share=0.04))
    assert line.endswith("evaluator 6.3% of the CPU, the ranks waiting 4.0% of the run for it")


def test_the_ranks_waits_to_the_confirmed_weights_leave_out_the_evaluations_that_found_them():
    """The waits eval.pause_share bounds: those for the evaluations that had ended when the
    confirmed weights were taken; the crossing's evaluation and its confirmation (the
    detection lag) are left out, as they are of the evaluator's CPU share."""
    from types import SimpleNamespace

    from analysis.scores import held_share

    # Two focused evaluations during the training, then the crossing at 600 s (ended at 607,
    # known after its confirmation at 630).
    evals = pd.DataFrame({"wall_time": [100.0, 300.0, 600.0, 600.0],
                          "seconds": [3.0, 9.0, 7.0, 23.0],
                          "known_at": [103.0, 309.0, 607.0, 630.0],
                          "held": [3.0, 9.0, 7.0, 23.0]})
    run = SimpleNamespace(tables={"eval": evals})
    assert held_share(run, 600.0, ended_by=True) == 0.02
    assert held_share(run, 630.0) == 42.0 / 630.0
    line = headline(row(held_share=0.067, held_share_to_confirmed=0.02))
    assert line.endswith("the ranks waiting 6.7% of the run for it (2.0% to the confirmed weights)")


def test_a_network_adams_epsilon_held_still_is_said_to_have_stopped_learning():
    line = headline(row(adam_still=0.988))
    assert line.endswith("; Adam's epsilon held 99% of the weights still at the last checkpoint "
                         "(their gradients' RMS under optim.eps / 100): the network had stopped "
                         "learning"), line
    assert "stopped learning" not in headline(row(adam_still=0.42))
    assert "stopped learning" in headline(row(target=math.nan, adam_still=0.95))
