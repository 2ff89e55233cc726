"""Every random stream of a run derives from `run.seed`, the rank and a stream name."""
from __future__ import annotations

import zlib

import numpy as np

# Below 2**30: a vector of simulators seeds its i-th one with seed + i, and ale-py refuses a
# seed of 2**31 - 1 or more, so a derived seed leaves room for 2**30 simulators above it.
SEED_LIMIT = 2**30


def derive_seed(run_seed: int, rank: int, stream: str) -> int:
    """A 30-bit seed, distinct per (run seed, rank, stream) and stable across runs. A stream
    that changes over a run (evaluations, restarts) names its index in `stream` rather than
    adding it to a seed, which could leave the range every backend accepts."""
    entropy = [run_seed, rank, zlib.crc32(stream.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] % SEED_LIMIT)


def rng(run_seed: int, rank: int, stream: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(run_seed, rank, stream))
