"""The scaling models' arithmetic (ddrl/bench/scaling.py, ddrl/bench/central.py) against
hand-counted steps."""
from __future__ import annotations

import numpy as np
import pytest

from ddrl.bench.central import CentralModel
from ddrl.bench.scaling import Link, fit_link
from ddrl.errors import DdrlError


def test_allreduce_recursive_doubling_exchanges_the_whole_gradient_log2_p_times():
    link = Link(latency=0.001, bandwidth=1e6)
    one = 0.001 + 2e6 / 1e6  # one exchange of a 2 MB gradient
    form = "recursive-doubling"
    assert link.allreduce(1, 2e6, form) == 0.0
    assert link.allreduce(2, 2e6, form) == pytest.approx(one)
    assert link.allreduce(3, 2e6, form) == pytest.approx(3 * one)   # 1 + a step in and out
    assert link.allreduce(4, 2e6, form) == pytest.approx(2 * one)
    assert link.allreduce(6, 2e6, form) == pytest.approx(4 * one)
    assert link.allreduce(64, 2e6, form) == pytest.approx(6 * one)


def test_allreduce_rabenseifner_halves_then_doubles():
    link = Link(latency=0.0, bandwidth=1e6)
    # Reduce-scatter n/2, n/4, n/8 and all-gather them back: 2 (1 - 1/8) n at 8 ranks.
    assert link.allreduce(2, 1e6) == pytest.approx(1.0)
    assert link.allreduce(4, 1e6) == pytest.approx(1.5)
    assert link.allreduce(8, 1e6) == pytest.approx(1.75)
    assert link.allreduce(3, 1e6) == pytest.approx(1.0 + 2.0)        # folded: n in, n out
    assert link.allreduce(64, 1e6) == pytest.approx(2 * 63 / 64)
    assert Link(0.01, np.inf).allreduce(64, 1e6) == pytest.approx(12 * 0.01)


def test_allreduce_ring_sends_2_p_minus_1_blocks_of_n_over_p():
    link = Link(latency=0.01, bandwidth=1e6)
    assert link.allreduce(2, 1e6, "ring") == pytest.approx(2 * (0.01 + 0.5))
    assert link.allreduce(5, 1e6, "ring") == pytest.approx(8 * (0.01 + 0.2))


def test_parameter_servers_bottleneck_is_the_busiest_link_one_way_at_a_time():
    link = Link(latency=0.0, bandwidth=1e6)
    # The worker's own link: its gradient out, then the new weights in.
    assert link.parameter_servers(2, 1e6, 4) == pytest.approx(2.0)
    # Each server: 64 workers' quarter slices in, then 64 new slices out.
    assert link.parameter_servers(64, 1e6, 4) == pytest.approx(32.0)
    assert Link(latency=0.01, bandwidth=1e6).parameter_servers(1, 1e6, 1) == pytest.approx(2.02)


def test_fit_link_recovers_latency_and_bandwidth():
    sizes = np.array([1e5, 1e6, 4e6])
    link = fit_link(sizes, 0.002 + sizes / 5e6, "recursive-doubling")
    assert link.latency == pytest.approx(0.002)
    assert link.bandwidth == pytest.approx(5e6)
    two_steps = fit_link(sizes, 0.002 + sizes / 5e6)  # Rabenseifner's 2 steps at p = 2
    assert two_steps.latency == pytest.approx(0.001)
    assert two_steps.allreduce(2, 1e6) == pytest.approx(0.002 + 1e6 / 5e6)
    with pytest.raises(DdrlError):
        fit_link(sizes, np.array([0.3, 0.2, 0.1]))


def test_the_central_model_is_the_least_of_actors_learner_and_link():
    # A run on 2 actor hosts: 600 frames/s, actors idle 70%, learner busy 80%, 4,000 B/frame:
    # the actors wait for the learner, whose rate is then the run's.
    run = {"frames_per_s": 600.0, "actor_idle": 0.7, "learner_busy": 0.8,
           "bytes_per_frame": 4000.0}
    model = CentralModel.fit(run, actor_hosts=2)
    assert model.actor_fps == pytest.approx(1000.0) and model.learner_fps == pytest.approx(600.0)
    assert model.frames_per_s(2, 10e9 / 8) == (pytest.approx(600.0), "learner")  # the run
    assert model.frames_per_s(64, 10e9 / 8) == (pytest.approx(600.0), "learner")
    # Actors busy (idle 10%), learner half idle: the actors are the limit.
    busy = CentralModel.fit({**run, "actor_idle": 0.1, "learner_busy": 0.5}, actor_hosts=2)
    assert busy.frames_per_s(2, 10e9 / 8) == (pytest.approx(600.0), "actors")
    assert busy.learner_fps == pytest.approx(1200.0)
    fast = CentralModel(model.actor_fps, 1e9, model.bytes_per_frame)
    assert fast.frames_per_s(64, 10e9 / 8) == (pytest.approx(64_000.0), "actors")
    assert fast.frames_per_s(64, 1e8 / 8) == (pytest.approx(3125.0), "link")
