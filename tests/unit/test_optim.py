"""The optimizer step every learner and parameter server runs (ddrl/optim.py's apply_step)
against Keras' own update, which checkpoints and the moments' readers assume."""
import numpy as np
import pytest
import tensorflow as tf

from ddrl.config import OptimConfig
from ddrl.optim import apply_step, get_moments, make_optimizer

SHAPES = [(3, 4), (4,), (1,)]


def variables(seed: int) -> list[tf.Variable]:
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


def gradients(step: int) -> list[tf.Tensor]:
    rng = np.random.default_rng(100 + step)
    return [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


def run(cfg: OptimConfig, fused: bool, steps: int = 4, lr_after: list[float] | None = None):
    vs = variables(0)
    opt = make_optimizer(cfg, workers=1)
    opt.build(vs)
    step = tf.function(lambda *g: apply_step(opt, list(g), vs), autograph=False)
    for i in range(steps):
        if lr_after:
            opt.learning_rate.assign(lr_after[i])
        if fused:
            step(*gradients(i))
        else:
            opt.apply_gradients(zip(gradients(i), vs))
    return vs, opt


@pytest.mark.parametrize("constants", [{}, {"beta1": 0.8, "beta2": 0.75, "eps": 1e-8}])
def test_adam_steps_as_keras_adam(constants):
    # The defaults and the paper's tuned Adam, at a rate that moves the weights visibly.
    cfg = OptimConfig(lr=0.05, **constants)
    ours, opt = run(cfg, fused=True)
    keras, keras_opt = run(cfg, fused=False)
    for a, b in zip(ours, keras):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    mine, theirs = get_moments(opt), get_moments(keras_opt)
    assert mine.iterations == theirs.iterations == 4
    np.testing.assert_allclose(mine.m, theirs.m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mine.v, theirs.v, rtol=1e-5, atol=1e-7)
    # The weights moved: a step that did nothing would pass the comparisons above only if
    # Keras' did nothing too.
    assert not np.allclose(ours[0].numpy(), variables(0)[0].numpy())


def test_adam_reads_the_scheduled_rate_on_every_step():
    # A warm-up assigns the rate between steps: the compiled step must not freeze the first.
    cfg = OptimConfig(lr=0.05)
    ours, _ = run(cfg, fused=True, lr_after=[0.0, 0.0, 0.05, 0.0])
    keras, _ = run(cfg, fused=False, lr_after=[0.0, 0.0, 0.05, 0.0])
    for a, b in zip(ours, keras):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    frozen, _ = run(cfg, fused=True, lr_after=[0.0] * 4)
    np.testing.assert_array_equal(frozen[0].numpy(), variables(0)[0].numpy())


def test_rmsprop_keeps_keras_update():
    cfg = OptimConfig(optimizer="rmsprop", lr=0.01, beta2=0.95, eps=0.01)
    ours, _ = run(cfg, fused=True)
    keras, _ = run(cfg, fused=False)
    for a, b in zip(ours, keras):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
