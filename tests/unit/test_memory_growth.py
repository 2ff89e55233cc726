"""A rank's memory does not grow with its network calls. TensorFlow 2.15 and 2.16 on Python
3.11 keep a small Python object of every tensor they make (tensorflow/tensorflow#62551):
1-2 KB a training update in ddrl's ranks, GiBs over a weekend (docs/reliability.md). Both
verified stacks are free of it; this fails on one that is not."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ddrl.config import load_config
from ddrl.learner import Learner

JOBS = Path(__file__).resolve().parents[2] / "jobs"
# TensorFlow fills caches of its own over the first ~2,000 calls (3,200 blocks on 2.21), then
# keeps nothing more: the count starts after them.
WARM_UP, CALLS = 4_000, 2_000


def test_network_calls_keep_no_python_objects():
    """Python's allocated blocks over 2,000 calls of the learner's inference on numpy
    observations, as a rank's actors make them: on a leaking stack three a call (the input's
    tensor and each output's; 6,001 on Python 3.11 with TensorFlow 2.15.1), here under one per
    twenty calls."""
    learner = Learner(load_config(JOBS / "cartpole.toml"), (4,), np.dtype(np.float32), 2)
    obs = np.zeros((8, 4), np.float32)
    for _ in range(WARM_UP):
        learner.predict(obs)
    before = sys.getallocatedblocks()
    for _ in range(CALLS):
        learner.predict(obs)
    grown = sys.getallocatedblocks() - before
    assert grown < CALLS // 20, f"{grown} blocks kept over {CALLS} calls"
