"""A rank gives its heap's free holes back to the system once a period, and has few arenas
(ddrl/heap.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddrl.heap import ARENAS, HeapTrim, _libc_function

pytestmark = pytest.mark.skipif(_libc_function("malloc_trim") is None,
                                reason="a C library without glibc's malloc_trim")

BLOCK, BLOCKS = 64_000, 1_000  # below glibc's mmap threshold: on the heap


def _anon_mib() -> float:
    with open("/proc/self/status") as f:
        return int(f.read().split("RssAnon:")[1].split()[0]) / 1024


def _holes() -> tuple[list[bytearray], float]:
    """64 MB of blocks with 9 in 10 freed: holes below the kept ones, which glibc keeps
    resident (a heap shrinks from its top only). The kept blocks, and the MiB freed."""
    blocks = [bytearray(b"\x01" * BLOCK) for _ in range(BLOCKS)]
    kept = blocks[::10]
    del blocks
    return kept, BLOCK * (BLOCKS - len(kept)) / 2**20


def test_a_due_trim_returns_the_holes():
    trim = HeapTrim(every_seconds=0.0)
    kept, freed = _holes()
    before = _anon_mib()
    trim.maybe()
    after = _anon_mib()
    assert before - after > freed / 2, f"{freed:.0f} MiB freed, RSS {before:.0f} -> {after:.0f} MiB"
    assert kept


def test_no_trim_before_the_period():
    now = [0.0]
    trim = HeapTrim(every_seconds=60.0, clock=lambda: now[0])
    kept, freed = _holes()
    before = _anon_mib()
    now[0] = 59.0
    trim.maybe()
    assert before - _anon_mib() < freed / 4
    now[0] = 61.0
    trim.maybe()
    assert before - _anon_mib() > freed / 2
    assert kept


# Six threads, each with memory of its own, alive at once; then glibc's count of its arenas.
ARENAS_SEEN = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "ddrl":
    import ddrl
together = threading.Barrier(7)
def work():
    kept = bytearray(100_000)
    together.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile() as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    print(open(out.name).read().count("<heap nr="))
together.wait()
"""


@pytest.mark.parametrize("imported", ["ddrl", "nothing"])
def test_importing_ddrl_caps_the_arenas(imported):
    """With ddrl imported, at most ARENAS arenas for six threads; without, one each and the
    main one (what rank 0's memory grew by)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", ARENAS_SEEN, imported], env=env,
                         capture_output=True, text=True, check=True, timeout=60)
    arenas = int(out.stdout.split()[-1])
    if imported == "ddrl":
        assert arenas <= ARENAS
    else:
        assert arenas == 7
