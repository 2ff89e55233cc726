"""What TensorFlow's CPU kernels are, and what every benchmark's CPU line says of them."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from ddrl.commands.info import cpu_summary

ONEDNN_STATE = ("import ddrl, tensorflow; from tensorflow.python.util import _pywrap_util_port; "
                "print(_pywrap_util_port.IsMklEnabled())")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="ddrl asks for oneDNN on x86 only")
@pytest.mark.parametrize("setting, enabled", [(None, "True"), ("0", "False")])
def test_tensorflow_runs_onednn_on_x86_unless_the_user_says_not(setting, enabled):
    # TensorFlow alone leaves oneDNN off on x86 CPUs without AVX-512 VNNI, BF16 or AMX; importing
    # ddrl first must turn it on on every x86 CPU, and leave a user's TF_ENABLE_ONEDNN_OPTS=0.
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    # The limit only catches a hang: beside a training job on the same cores, this import took
    # 90 s of wall time for 3 s of CPU.
    res = subprocess.run([sys.executable, "-c", ONEDNN_STATE], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == enabled


@pytest.mark.parametrize("value", ["0", "false", "False"])
def test_the_cpu_line_says_when_onednn_is_off(monkeypatch, value):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", value)
    assert cpu_summary().endswith(f", oneDNN off (TF_ENABLE_ONEDNN_OPTS={value})")


@pytest.mark.parametrize("value", ["1", "true"])
def test_the_cpu_line_is_silent_when_onednn_is_on(monkeypatch, value):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", value)
    assert "oneDNN off" not in cpu_summary()
