"""TensorFlow's native log lines that TF_CPP_MIN_LOG_LEVEL does not reach are dropped, and
nothing else written to stderr in the meantime is lost."""
from __future__ import annotations

import os
import subprocess
import sys

from ddrl.output import quiet_native_logs

# As TensorFlow 2.18 writes them while it loads and at XLA's first compile.
NATIVE = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
          b"E0000 00:00:1796635934.069297    9761 cuda_dnn.cc:8310] Unable to register cuDNN "
          b"factory: Attempting to register factory for plugin cuDNN when one has already been "
          b"registered\n"
          b"I0000 00:00:1796635944.685212    9861 service.cc:148] XLA service 0x563e8e383650 "
          b"initialized for platform Host\n"
          b"W1207 09:31:02.123456 12345 cpu_feature_guard.cc:210] a warning\n")
KEPT = (b"ddrl: error: a line of ddrl's own\n"
        b"F0000 00:00:1796635934.069297    9761 init.cc:1] a fatal line\n"
        b"Traceback (most recent call last):\n")


def test_native_log_lines_are_dropped_and_the_rest_written_back(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    native, kept = NATIVE.splitlines(keepends=True), KEPT.splitlines(keepends=True)
    with quiet_native_logs():
        for i, line in enumerate(native):
            os.write(2, line)
            if i < len(kept):
                os.write(2, kept[i])
    assert capfd.readouterr().err.encode() == KEPT


def test_all_of_it_passes_when_the_user_asks_for_tensorflows_logs(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    with quiet_native_logs():
        os.write(2, NATIVE + KEPT)
    assert capfd.readouterr().err.encode() == NATIVE + KEPT


def test_importing_tensorflow_after_ddrl_writes_nothing_and_leaves_pandas_out():
    """One process for both (a TensorFlow import is seconds): its import writes nothing, and
    tf-keras' optional pandas is not imported with it, yet imports as usual afterwards."""
    script = ("import sys, ddrl, tensorflow\n"
              "print('pandas' in sys.modules, 'tf_keras' in sys.modules)\n"
              "import pandas\n"
              "print(pandas.DataFrame({'a': [1]}).shape)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert res.stdout.split("\n")[:2] == ["False True", "(1, 1)"], res.stdout
