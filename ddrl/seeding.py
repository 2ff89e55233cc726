"""Every random stream of a run derives from `run.seed`, the rank and a stream name."""
from __future__ import annotations

import zlib

import numpy as np


def derive_seed(run_seed: int, rank: int, stream: str) -> int:
    """A 31-bit seed, distinct per (run seed, rank, stream) and stable across runs."""
    entropy = [run_seed, rank, zlib.crc32(stream.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def rng(run_seed: int, rank: int, stream: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(run_seed, rank, stream))
