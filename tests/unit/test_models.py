"""The image nets' input stem: ale-py's channels-first uint8 frames reach the first
convolution channels-last, scaled to [0, 1], in the compute precision."""
from __future__ import annotations

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
