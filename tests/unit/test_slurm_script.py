"""Slurm's `--array` syntax, as `ddrl slurm` checks it and `ddrl sweep --array` picks lines."""
from __future__ import annotations

import pytest

from ddrl.commands.slurm import array_tasks
from ddrl.errors import DdrlError


@pytest.mark.parametrize("spec, tasks", [
    ("4", [4]),
    ("0-3", [0, 1, 2, 3]),
    ("0-9:4", [0, 4, 8]),
    ("7,1-2,2", [1, 2, 7]),
    ("0-5%2", [0, 1, 2, 3, 4, 5]),
])
def test_array_tasks_are_slurms_indices(spec, tasks):
    assert array_tasks(spec) == tasks


def test_a_stepped_range_may_end_past_the_sweeps_last_line_if_its_tasks_do_not():
    assert array_tasks("0-20:7", 15) == [0, 7, 14]


@pytest.mark.parametrize("spec, n_runs, message", [
    ("0-9%", None, "expected indices like"),
    ("1,,2", None, "expected indices like"),
    ("-1", None, "expected indices like"),
    ("5-3", None, "the range 5-3 holds no task"),
    ("0-4:0", None, "the range 0-4:0 holds no task"),
    ("0,12", 12, "the sweep file has 12 runs (tasks 0-11)"),
    ("0-21:7", 15, "the sweep file has 15 runs (tasks 0-14)"),
])
def test_an_array_that_names_no_task_or_a_missing_line_is_refused(spec, n_runs, message):
    with pytest.raises(DdrlError, match="--array") as err:
        array_tasks(spec, n_runs)
    assert message in str(err.value)
