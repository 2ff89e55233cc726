"""Counts on the command line are checked where they are parsed: a usage error (exit 2), never
a traceback later."""
from __future__ import annotations

import pytest

from ddrl.cli import build_parser


@pytest.mark.parametrize("argv", [["eval", "runs/x", "--episodes", "0"],
                                  ["eval", "runs/x", "--episodes", "-3"],
                                  ["slurm", "jobs/pong-ppo.toml", "--nodes", "0"]])
def test_a_count_below_one_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(argv).parse_args(argv)
    assert exc.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "ten"])
def test_a_video_length_that_is_not_a_positive_number_is_a_usage_error(value, capsys):
    argv = ["eval", "runs/x", "--video", "v.gif", "--video-minutes", value]
    with pytest.raises(SystemExit) as exc:
        build_parser(argv).parse_args(argv)
    assert exc.value.code == 2
    assert "expected a positive number" in capsys.readouterr().err
