"""Counts on the command line are checked where they are parsed: a usage error (exit 2), never
a traceback later."""
from __future__ import annotations

import subprocess
import sys

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


@pytest.mark.parametrize("command", [["bench", "project"], ["bench", "target"], ["status"],
                                     ["analyze"], ["slurm"]])
def test_commands_that_read_logs_parse_without_loading_tensorflow(command):
    """TensorFlow's import costs seconds of CPU: a command that only reads logs or prints a
    script must not pay it for its argument parser (each `ddrl bench` kind's module is imported
    to build the parser)."""
    probe = ("import sys; from ddrl.cli import build_parser; "
             f"build_parser({command!r} + ['x']); print('tensorflow' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False", command
