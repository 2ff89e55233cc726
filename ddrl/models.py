"""Networks: the paper's BA3C net, the Nature CNN, the small A3C net and an MLP, each with an
actor-critic head or a Q head (plain or dueling) for DQN."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ddrl.config import ModelConfig
from ddrl.cpus import cpu_flags
from ddrl.output import spend_xla_first_logs

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


class ResettingLSTMCell(L.Layer):
    """An LSTM cell whose input's last feature is 1 at the first step of a new game: the state
    is zeroed before that step, so a sequence that crosses a game's end (R2D2's replayed
    sequences) does not carry one game's memory into the next."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.cell = L.LSTMCell(units)
        self.state_size = self.cell.state_size
        self.output_size = units

    def build(self, input_shape):
        self.cell.build((*input_shape[:-1], input_shape[-1] - 1))
        super().build(input_shape)

    def call(self, inputs, states):
        keep = 1.0 - inputs[:, -1:]
        return self.cell(inputs[:, :-1], [s * keep for s in states])


class FramesToChannelsLast(L.Layer):
    """Stacked uint8 frames (B, C, H, W), as ale-py stacks them, to the channels-last floats
    in [0, 1] that TF's CPU convolutions want. Compiled by XLA: TensorFlow's own Transpose
    kernel moves about 1 GB/s (2 ms for a batch of 128 64x64x4 frames on a Sapphire Rapids
    core, a sixth of the A3C net's training step); XLA's fused cast, scale and transpose take
    0.8 ms where the three kernels took 3.1."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        spend_xla_first_logs()
        self._convert = tf.function(self._convert_fn, jit_compile=True, autograph=False)

    def _convert_fn(self, frames: tf.Tensor) -> tf.Tensor:
        scaled = tf.cast(frames, tf.float32) * (1.0 / 255)
        return tf.cast(tf.transpose(scaled, [0, 2, 3, 1]), self.compute_dtype)

    def call(self, frames: tf.Tensor) -> tf.Tensor:
        return self._convert(frames)


def compute_precision(cfg: ModelConfig) -> str:
    """`model.precision`, with `auto` decided for this CPU: bfloat16 for the image nets where
    it has AMX-BF16 (the Pong recipe's node ran 9% more frames/s in bfloat16 on Sapphire
    Rapids), float32 elsewhere (without AMX, oneDNN's bfloat16 was slower than float32, even
    with AVX512-BF16; docs/performance.md)."""
    if cfg.precision != "auto":
        return cfg.precision
    return "bfloat16" if cfg.arch != "mlp" and "amx_bf16" in cpu_flags() else "float32"


# Keras would hand the custom layers' `call` to AutoGraph while it builds the functional model,
# and AutoGraph writes each converted source to a file in the temporary directory that only a
# clean exit removes (the evaluator process is killed at a run's end); they have no control flow
# to convert.
@tf.autograph.experimental.do_not_convert
def build_model(cfg: ModelConfig, obs_shape: tuple[int, ...], n_actions: int,
                head: str = "actor_critic", support: np.ndarray | None = None,
                recurrent: int = 0) -> tf.keras.Model:
    """Outputs two float32 tensors whatever the compute precision: (policy logits, value) with
    the actor-critic head; (Q-values, max_a Q) with a Q head ("q", or "dueling": V + A - mean A);
    (Q-values, log-probabilities (B, A, atoms)) with a categorical one ("q_categorical",
    "dueling_categorical": a distribution over the atoms of `support` per action, Q its mean).
    The greedy action is the argmax of the first output for every head.

    `recurrent` > 0 (R2D2's Q head, or the actor-critic one): an LSTM of that many units
    between the torso and the head, over sequences. Inputs (observations (B, T, ...), game
    starts (B, T), h (B, units), c (B, units)); outputs the head's two per step ((B, T, A) and
    (B, T)), then h and c after the last step."""
    tf.keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if compute_precision(cfg) == "bfloat16" else "float32")
    inputs, x = _torso(cfg, obs_shape)
    if recurrent:
        torso = tf.keras.Model(inputs, x, name=f"{cfg.arch}-torso")
        obs = L.Input((None, *obs_shape), dtype=inputs.dtype)
        starts = L.Input((None,), dtype=tf.float32)
        h, c = L.Input((recurrent,)), L.Input((recurrent,))
        x = L.Concatenate()([tf.cast(L.TimeDistributed(torso)(obs), tf.float32),
                             starts[..., None]])
        x, h_out, c_out = L.RNN(ResettingLSTMCell(recurrent), return_sequences=True,
                                return_state=True)(x, initial_state=[h, c])
        if head == "actor_critic":
            outputs = _actor_critic_head(x, n_actions, cfg.arch != "mlp")
        else:
            q = _q_head(x, n_actions, None, head.startswith("dueling"))
            outputs = [q, tf.reduce_max(q, axis=-1)]
        return tf.keras.Model([obs, starts, h, c], [*outputs, h_out, c_out],
                              name=f"{cfg.arch}-{head}-lstm")
    if head != "actor_critic":
        q = _q_head(x, n_actions, support, head.startswith("dueling"))
        if support is None:
            return tf.keras.Model(inputs, [q, tf.reduce_max(q, axis=-1)], name=f"{cfg.arch}-{head}")
        log_p = tf.nn.log_softmax(q, axis=-1)
        mean = tf.reduce_sum(tf.exp(log_p) * tf.constant(support, tf.float32), axis=-1)
        return tf.keras.Model(inputs, [mean, log_p], name=f"{cfg.arch}-{head}")
    return tf.keras.Model(inputs, _actor_critic_head(x, n_actions, cfg.arch != "mlp"),
                          name=cfg.arch)


def _actor_critic_head(x: tf.Tensor, n_actions: int, image: bool) -> list[tf.Tensor]:
    """Policy logits and the value (without its last axis of 1), on features (..., F)."""
    # Image nets: a small policy head starts the policy uniform, whatever the features. The
    # MLP keeps Keras' defaults, on which the CartPole checks and figures were measured.
    logits = L.Dense(n_actions, dtype="float32", name="policy",
                     kernel_initializer=_orthogonal(0.01) if image else "glorot_uniform")(x)
    value = L.Dense(1, dtype="float32", name="value",
                    kernel_initializer=_orthogonal(1.0) if image else "glorot_uniform")(x)
    return [logits, tf.squeeze(value, -1)]


def _torso(cfg: ModelConfig, obs_shape: tuple[int, ...]) -> tuple[tf.Tensor, tf.Tensor]:
    """The observation input and the features every head starts from."""
    if cfg.arch == "mlp":
        inputs = L.Input(obs_shape, dtype=tf.float32)
        x = inputs
        for width in cfg.hidden:
            x = L.Dense(width, activation="tanh")(x)
        return inputs, x
    inputs = L.Input(obs_shape, dtype=tf.uint8)
    x = FramesToChannelsLast()(inputs)
    for filters, kernel, stride, pool in CONV_STACKS[cfg.arch]:
        x = L.Conv2D(filters, kernel, stride, padding="valid", activation="relu",
                     kernel_initializer=_orthogonal(HIDDEN_INIT))(x)
        if pool:
            x = L.MaxPooling2D(2)(x)
    x = L.Flatten()(x)
    x = L.Dense(cfg.fc if cfg.arch == "ddrl" else FC_WIDTH[cfg.arch], activation="relu",
                kernel_initializer=_orthogonal(HIDDEN_INIT))(x)
    return inputs, x


def _q_head(x: tf.Tensor, n_actions: int, support: np.ndarray | None, dueling: bool) -> tf.Tensor:
    """Q-values (..., actions) over features (..., width), one data point or a sequence; with
    a support, unnormalised log-probabilities (B, actions, atoms)."""
    atoms = () if support is None else (len(support),)
    q = L.Dense(n_actions * int(np.prod(atoms)), dtype="float32", name="q")(x)
    if atoms:
        q = L.Reshape((n_actions, *atoms))(q)
    if dueling:
        value = L.Dense(int(np.prod(atoms)), dtype="float32", name="state_value")(x)
        if atoms:
            value = L.Reshape((1, *atoms))(value)
        # The action axis: last for Q-values, before the atoms for distributions.
        q = value + q - tf.reduce_mean(q, axis=-1 - len(atoms), keepdims=True)
    return q


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
