"""Networks: the paper's BA3C net, the Nature CNN, the small A3C net and an MLP, each with an
actor-critic head or a Q head (plain or dueling) for DQN."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.config import ModelConfig

L = tf.keras.layers


def _orthogonal(gain: float) -> tf.keras.initializers.Initializer:
    # Orthogonal weights with gain sqrt(2) keep activations' scale through ReLU layers (the
    # A2C / PPO convention of baselines, SB3 and CleanRL); Keras' default Glorot shrinks them.
    return tf.keras.initializers.Orthogonal(gain)


HIDDEN_INIT = 2 ** 0.5

# name -> conv stack (filters, kernel, stride, maxpool after); the paper's net uses stride-1
# 5x5 VALID convolutions with 2x2 max-pooling (84->80->40->36->18->14->7->5).
CONV_STACKS = {
    "ddrl": [(32, 5, 1, True), (32, 5, 1, True), (64, 5, 1, True), (64, 3, 1, False)],
    "nature": [(32, 8, 4, False), (64, 4, 2, False), (64, 3, 1, False)],
    "a3c": [(16, 8, 4, False), (32, 4, 2, False)],
}
FC_WIDTH = {"nature": 512, "a3c": 256}


def build_model(cfg: ModelConfig, obs_shape: tuple[int, ...], n_actions: int,
                head: str = "actor_critic", support: np.ndarray | None = None) -> tf.keras.Model:
    """Outputs two float32 tensors whatever the compute precision: (policy logits, value) with
    the actor-critic head; (Q-values, max_a Q) with a Q head ("q", or "dueling": V + A - mean A);
    (Q-values, log-probabilities (B, A, atoms)) with a categorical one ("q_categorical",
    "dueling_categorical": a distribution over the atoms of `support` per action, Q its mean).
    The greedy action is the argmax of the first output for every head."""
    tf.keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if cfg.precision == "bfloat16" else "float32")
    if cfg.arch == "mlp":
        inputs = L.Input(obs_shape, dtype=tf.float32)
        x = inputs
        for width in cfg.hidden:
            x = L.Dense(width, activation="tanh")(x)
    else:
        inputs = L.Input(obs_shape, dtype=tf.uint8)
        # ale-py stacks frames channels-first; TF's CPU convolutions want channels-last.
        # Transposed while still uint8: a quarter of the memory traffic of float32.
        x = L.Rescaling(1.0 / 255)(L.Permute((2, 3, 1))(inputs))
        for filters, kernel, stride, pool in CONV_STACKS[cfg.arch]:
            x = L.Conv2D(filters, kernel, stride, padding="valid", activation="relu",
                         kernel_initializer=_orthogonal(HIDDEN_INIT))(x)
            if pool:
                x = L.MaxPooling2D(2)(x)
        x = L.Flatten()(x)
        x = L.Dense(cfg.fc if cfg.arch == "ddrl" else FC_WIDTH[cfg.arch], activation="relu",
                    kernel_initializer=_orthogonal(HIDDEN_INIT))(x)
    # Image nets: a small policy head starts the policy uniform, whatever the features. The
    # MLP keeps Keras' defaults, on which the CartPole checks and figures were measured.
    image = cfg.arch != "mlp"
    if head != "actor_critic":
        # (B, actions), or (B, actions, atoms) with a support.
        shape = (n_actions,) if support is None else (n_actions, len(support))
        q = L.Reshape(shape)(L.Dense(int(np.prod(shape)), dtype="float32", name="q")(x))
        if head.startswith("dueling"):
            value = L.Dense(int(np.prod(shape[1:])), dtype="float32", name="state_value")(x)
            value = L.Reshape((1, *shape[1:]))(value)
            q = value + q - tf.reduce_mean(q, axis=1, keepdims=True)
        if support is None:
            return tf.keras.Model(inputs, [q, tf.reduce_max(q, axis=-1)], name=f"{cfg.arch}-{head}")
        log_p = tf.nn.log_softmax(q, axis=-1)
        mean = tf.reduce_sum(tf.exp(log_p) * tf.constant(support, tf.float32), axis=-1)
        return tf.keras.Model(inputs, [mean, log_p], name=f"{cfg.arch}-{head}")
    logits = L.Dense(n_actions, dtype="float32", name="policy",
                     kernel_initializer=_orthogonal(0.01) if image else "glorot_uniform")(x)
    value = L.Dense(1, dtype="float32", name="value",
                    kernel_initializer=_orthogonal(1.0) if image else "glorot_uniform")(x)
    return tf.keras.Model(inputs, [logits, tf.squeeze(value, -1)], name=cfg.arch)


def forward_flops(model: tf.keras.Model) -> int:
    """Multiply-adds x 2 of one observation's forward pass (conv and dense layers)."""
    flops = 0
    for layer in model.layers:
        if isinstance(layer, L.Conv2D):
            _, h, w, c_out = layer.output_shape
            kh, kw = layer.kernel_size
            flops += 2 * h * w * c_out * kh * kw * layer.input_shape[-1]
        elif isinstance(layer, L.Dense):
            flops += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return flops
