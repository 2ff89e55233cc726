"""The scaling model's arithmetic (ddrl/bench/scaling.py) against hand-counted steps."""
from __future__ import annotations

import numpy as np
import pytest

from ddrl.bench.scaling import Link, fit_link
from ddrl.errors import DdrlError


def test_allreduce_steps_follow_recursive_doubling():
    link = Link(latency=0.001, bandwidth=1e6)
    one = 0.001 + 2e6 / 1e6  # one exchange of a 2 MB gradient
    assert link.allreduce(1, 2e6) == 0.0
    assert link.allreduce(2, 2e6) == pytest.approx(one)
    assert link.allreduce(3, 2e6) == pytest.approx(3 * one)   # 1 + a step in and out
    assert link.allreduce(4, 2e6) == pytest.approx(2 * one)
    assert link.allreduce(6, 2e6) == pytest.approx(4 * one)
    assert link.allreduce(64, 2e6) == pytest.approx(6 * one)


def test_parameter_servers_bottleneck_is_the_busiest_link_one_way_at_a_time():
    link = Link(latency=0.0, bandwidth=1e6)
    # The worker's own link: its gradient out, then the new weights in.
    assert link.parameter_servers(2, 1e6, 4) == pytest.approx(2.0)
    # Each server: 64 workers' quarter slices in, then 64 new slices out.
    assert link.parameter_servers(64, 1e6, 4) == pytest.approx(32.0)
    assert Link(latency=0.01, bandwidth=1e6).parameter_servers(1, 1e6, 1) == pytest.approx(2.02)


def test_fit_link_recovers_latency_and_bandwidth():
    sizes = np.array([1e5, 1e6, 4e6])
    link = fit_link(sizes, 0.002 + sizes / 5e6)
    assert link.latency == pytest.approx(0.002)
    assert link.bandwidth == pytest.approx(5e6)
    with pytest.raises(DdrlError):
        fit_link(sizes, np.array([0.3, 0.2, 0.1]))
