"""`ddrl`'s exit without Python's teardown (`ddrl.cli._exit_without_teardown`): what a normal
exit does for the program still happens."""
from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np

SCRIPT = """
import atexit, sys
import h5py, numpy as np
from ddrl.cli import _exit_without_teardown

atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
log = h5py.File(sys.argv[1], "w")  # left open, as an error path might leave a log
log["rows"] = np.arange(5)
sys.stdout.write("no newline, not flushed")
_exit_without_teardown(7)
"""


def test_exit_code_handlers_streams_and_an_open_hdf5_file_survive(tmp_path):
    path = tmp_path / "log.h5"
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True,
                         text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (7, "no newline, not flushed", "")
    assert (tmp_path / "log.h5.atexit").read_text() == "ran"
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["rows"][:], np.arange(5))
