"""The image nets' input stem: ale-py's channels-first uint8 frames reach the first
convolution channels-last, scaled to [0, 1], in the compute precision. Building the nets leaves
nothing in the temporary directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from ddrl.config import ModelConfig
from ddrl.cpus import cpu_flags
from ddrl.models import FramesToChannelsLast, build_model, compute_precision


@pytest.mark.parametrize("precision,dtype,tolerance", [("float32", np.float32, 1e-7),
                                                        ("bfloat16", tf.bfloat16, 4e-3)])
def test_stem_moves_channels_last_and_scales(precision, dtype, tolerance):
    model = build_model(ModelConfig(arch="a3c", precision=precision), (4, 64, 64), 6)
    stem = next(layer for layer in model.layers if isinstance(layer, FramesToChannelsLast))
    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 64, 64), dtype=np.uint8)
    got = tf.keras.Model(model.inputs, stem.output)(frames)
    assert got.dtype == dtype
    want = np.transpose(frames, (0, 2, 3, 1)).astype(np.float32) / 255
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want, atol=tolerance)
    tf.keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("arch", ["a3c", "nature", "mlp"])
def test_auto_precision_is_bfloat16_only_for_image_nets_on_amx(arch):
    amx = "amx_bf16" in cpu_flags()
    want = "bfloat16" if amx and arch != "mlp" else "float32"
    assert compute_precision(ModelConfig(arch=arch, precision="auto")) == want
    assert compute_precision(ModelConfig(arch=arch, precision="float32")) == "float32"


def test_a_recurrent_actor_critic_carries_its_state_and_drops_it_where_a_game_starts():
    """Unrolled over two halves of a sequence from the state the first half ends in, the net
    gives the outputs of one unroll over the whole; a game start zeroes the state."""
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), (4,), 3, recurrent=5)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((2, 6, 4)).astype(np.float32)
    starts = np.zeros((2, 6), np.float32)
    h = c = np.zeros((2, 5), np.float32)
    logits, values, h_end, c_end = model([obs, starts, h, c])
    assert logits.shape == (2, 6, 3) and values.shape == (2, 6) and h_end.shape == (2, 5)
    _, first_values, h_mid, c_mid = model([obs[:, :3], starts[:, :3], h, c])
    _, later_values, _, _ = model([obs[:, 3:], starts[:, 3:], h_mid, c_mid])
    np.testing.assert_allclose(np.concatenate([first_values, later_values], 1), values,
                               atol=1e-6)
    starts[:, 3] = 1  # a new game at step 3: what follows ignores the state it arrives with
    _, fresh, _, _ = model([obs[:, 3:], starts[:, 3:], h_mid, c_mid])
    _, from_zero, _, _ = model([obs[:, 3:], starts[:, 3:], h, c])
    np.testing.assert_allclose(fresh, from_zero, atol=1e-6)
    assert not np.allclose(fresh, later_values, atol=1e-4)


def test_building_the_nets_leaves_no_file_in_the_temporary_directory(tmp_path):
    """AutoGraph writes the source of each function it converts to the temporary directory and
    only a clean exit removes it: a process killed (the evaluator at a run's end) would leave
    one behind per run. Built in a process of its own (AutoGraph caches what it converted),
    which ends as a killed one would, without exit handlers."""
    jobs = Path(__file__).resolve().parents[2] / "jobs"
    script = (
        "import os, numpy as np\n"
        "from ddrl.config import load_config\n"
        "from ddrl.learner import Learner\n"
        "for job in ('pong-ppo', 'pong-rainbow', 'pong-r2d2'):\n"
        f"    cfg = load_config('{jobs}/' + job + '.toml')\n"
        "    Learner(cfg, (4, cfg.env.size, cfg.env.size), np.uint8, 6)\n"
        "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   env={**os.environ, "TMPDIR": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.iterdir()) == []
