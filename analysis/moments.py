"""Whether a run's network was still learning at its last checkpoint, read from Adam's moments.
A weight whose gradient RMS (the square root of Adam's bias-corrected second moment) is below a
hundredth of `optim.eps` moves less than a hundredth of the rate an update. A prioritized DQN at
batch 512 and Adam 1e-3 had 99% of its weights so after 29,528 updates while its loss and
gradient norm (the output biases') looked alive; Pong runs that learned had 11-42% (ReLU units
that never fire), docs/results/dqn.md."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint

# Gradient RMS below this share of optim.eps: Adam's step is under a hundredth of the rate.
STILL = 0.01
# A share of still weights at which the run is said to have stopped learning.
STOPPED = 0.9


def still_share(run_dir: Path, optim: dict[str, Any]) -> float:
    """The share of the weights Adam's epsilon held still at the run's last checkpoint (`optim`:
    the run's written config's); NaN without one, for another optimizer, or for a state that is
    not each weight's m and v."""
    if optim.get("optimizer") != "adam" or "eps" not in optim or "beta2" not in optim:
        return math.nan
    path = checkpoint.latest(run_dir / "checkpoints")
    if path is None:
        return math.nan
    try:
        ckpt = checkpoint.load(path)
    except DdrlError:
        return math.nan
    state = ckpt.optimizer
    second = state[2::2]
    if len(state) % 2 == 0 or sum(v.size for v in second) != ckpt.weights.size:
        return math.nan
    steps = max(int(state[0]), 1)
    bias = 1.0 - float(optim["beta2"]) ** steps
    rms = np.sqrt(np.concatenate([v.ravel() for v in second]) / bias)
    return float((rms < STILL * float(optim["eps"])).mean())
