"""The share of weights Adam's epsilon holds still, read from a run's last checkpoint."""
import math

import numpy as np

from analysis.moments import still_share
from ddrl.rundir import checkpoint

OPTIM = {"optimizer": "adam", "eps": 1e-4, "beta2": 0.99}


def save(run_dir, rms: list[np.ndarray], steps: int = 1000) -> None:
    """A checkpoint of one weight tensor per `rms` whose Adam state gives that gradient RMS."""
    state = [np.array(steps)]
    for r in rms:
        # Adam's v is the bias-corrected mean square times (1 - beta2 ** steps).
        state += [np.zeros_like(r), r ** 2 * (1 - OPTIM["beta2"] ** steps)]
    weights = np.zeros(sum(r.size for r in rms), np.float32)
    directory = run_dir / "checkpoints"
    directory.mkdir(exist_ok=True)
    checkpoint.save(directory, checkpoint.Checkpoint(steps, 0, 0.0, 0, weights, state), keep=1)


def test_the_weights_under_a_hundredth_of_epsilon_are_counted(tmp_path):
    # 3 of 4 under 1e-6 (eps / 100), one at eps: whatever the tensors, the share is per weight.
    save(tmp_path, [np.array([1e-9, 5e-7], np.float32), np.array([[2e-7], [1e-4]], np.float32)])
    assert still_share(tmp_path, OPTIM) == 0.75


def test_without_an_adam_checkpoint_there_is_no_figure(tmp_path):
    assert math.isnan(still_share(tmp_path, OPTIM))
    save(tmp_path, [np.array([1e-9], np.float32)])
    assert math.isnan(still_share(tmp_path, {**OPTIM, "optimizer": "rmsprop"}))
    # A state that is not each weight's m and v (RMSProp's, a parameter server's shard).
    (tmp_path / "checkpoints" / "ckpt-0000001000.npz").unlink()
    steps = np.array(5)
    checkpoint.save(tmp_path / "checkpoints", checkpoint.Checkpoint(
        5, 0, 0.0, 0, np.zeros(3, np.float32), [steps, np.zeros(3)]), keep=1)
    assert math.isnan(still_share(tmp_path, OPTIM))
