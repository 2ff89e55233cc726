"""The network, its Adam state and the compiled steps every node mode shares.

Gradients leave as one flat float32 vector: the sync backends all-reduce or shard that one
buffer, and the update applies a flat vector, so every rank runs the same Adam step.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from ddrl.algos import STAT_NAMES, make_algorithm
from ddrl.algos.actor_critic import clip_by_average_norm
from ddrl.algos.batch import Batch
from ddrl.config import Config
from ddrl.models import build_model
from ddrl.optim import AdamMoments, apply_step, get_moments, make_optimizer, scheduled_lr, set_moments


class Learner:
    def __init__(self, cfg: Config, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                 n_actions: int, workers: int = 1):
        self.cfg = cfg
        self.n_actions = n_actions
        self.algo = make_algorithm(cfg)
        self.recurrent = self.algo.recurrent
        self.model = self._build(obs_shape)
        self.variables = self.model.trainable_variables
        self.optimizer = make_optimizer(cfg.optim, workers)
        self._base_lr = float(tf.keras.backend.get_value(self.optimizer.learning_rate))
        self.optimizer.build(self.variables)
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.num_params = sum(self.sizes)
        dtype = tf.as_dtype(obs_dtype)
        # A recurrent network infers on sequences (B, T, ...) from a state, one step long when
        # acting; a minibatch holds sequences of algo.sequence.
        self._inputs = [tf.TensorSpec((None, *obs_shape), dtype)] if not self.recurrent else [
            tf.TensorSpec((None, None, *obs_shape), dtype), tf.TensorSpec((None, None), tf.float32),
            *[tf.TensorSpec((None, self.recurrent), tf.float32)] * 2]
        self._obs_shape = obs_shape
        seq = (self.algo.sequence,) if self.algo.sequence else ()
        # Traced once here and called as concrete functions: that skips tf.function's dispatch
        # (argument binding, trace-cache lookup), a tenth of a small inference call on 2 cores.
        # autograph=False: no step branches on a tensor, and AutoGraph's rewriting of Keras'
        # Python source took 4 of a small run's 7 s of start-up on every rank.
        self._predict = tf.function(self._predict_fn, autograph=False).get_concrete_function(
            *self._inputs)
        self._gradients = tf.function(self._gradients_fn, autograph=False).get_concrete_function(
            tf.TensorSpec((None, *seq, *obs_shape), dtype),
            tf.TensorSpec((None, *self.algo.action_shape), tf.int32),
            *[tf.TensorSpec((None, *self.algo.target_shapes.get(f, ())), tf.float32)
              for f in self.algo.fields])
        self._apply = tf.function(self._apply_fn, autograph=False).get_concrete_function(
            tf.TensorSpec((self.num_params,), tf.float32))
        self._fused = None
        if cfg.sync.virtual_fused and cfg.sync.virtual_ranks > 1:
            self._fused = tf.function(self._fused_fn, autograph=False).get_concrete_function(
                *self._gradients.structured_input_signature[0])
        self._grad: tf.Tensor | None = None
        self._grad_view: np.ndarray | None = None

    def _build(self, obs_shape: tuple[int, ...]) -> tf.keras.Model:
        return build_model(self.cfg.model, obs_shape, self.n_actions, self.algo.head,
                           self.algo.support, self.recurrent)

    def _predict_fn(self, *inputs):
        return self.model(list(inputs) if self.recurrent else inputs[0], training=False)

    def _gradients_fn(self, obs, actions, *targets):
        targets = dict(zip(self.algo.fields, targets))
        with tf.GradientTape() as tape:
            logits, values = self.algo.forward(self.model, obs, targets, training=True)
            loss, stats = self.algo.loss(logits, values, actions, targets)
        return self._flat(tape.gradient(loss, self.variables), stats)

    def _fused_fn(self, obs, actions, *targets):
        """k ranks' minibatches of equal size, one after the other: one forward pass, then
        each rank's loss on its own rows (its means and normalisations over its own
        samples), summed. Its gradient is the sum of the k ranks' gradients."""
        k = self.cfg.sync.virtual_ranks
        targets = dict(zip(self.algo.fields, targets))

        def by_rank(x):
            return tf.reshape(x, tf.concat([[k, -1], tf.shape(x)[1:]], 0))
        with tf.GradientTape() as tape:
            logits, values = self.algo.forward(self.model, obs, targets, training=True)
            losses, stats = tf.vectorized_map(
                lambda r: self.algo.loss(*r[:3], r[3]),
                (by_rank(logits), by_rank(values), by_rank(actions),
                 {f: by_rank(v) for f, v in targets.items()}))
            loss = tf.reduce_sum(losses)
        stats = {n: v[0] for n, v in stats.items() if n != "per_sample"} | (
            {"per_sample": tf.reshape(stats["per_sample"], [-1])} if "per_sample" in stats else {})
        # The logged norm: the ranks' mean gradient's (no rank's own is ever formed).
        return self._flat(tape.gradient(loss, self.variables), stats, ranks=k)

    def _flat(self, grads, stats, ranks: int = 1):
        o = self.cfg.optim
        stats["grad_norm"] = tf.linalg.global_norm(grads) / ranks
        if o.clip_per_tensor > 0:
            grads = [clip_by_average_norm(g, o.clip_per_tensor) for g in grads]
        if o.max_grad_norm > 0 and o.clip_scope == "rank":
            grads, _ = tf.clip_by_global_norm(grads, o.max_grad_norm, use_norm=stats["grad_norm"])
        flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads], axis=0)
        per_sample = tf.cast(stats.get("per_sample", tf.zeros([0])), tf.float32)
        return flat, tf.stack([tf.cast(stats[n], tf.float32) for n in STAT_NAMES]), per_sample

    def _apply_fn(self, flat):
        o = self.cfg.optim
        if o.max_grad_norm > 0 and o.clip_scope == "sync":
            flat = tf.clip_by_norm(flat, o.max_grad_norm)
        grads = [tf.reshape(g, v.shape) for g, v in zip(tf.split(flat, self.sizes), self.variables)]
        apply_step(self.optimizer, grads, self.variables)

    def predict(self, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The network's two outputs on observations; a recurrent network's four (Q, max_a Q,
        h, c) on (observations (B, T, ...), game starts (B, T), h, c)."""
        return tuple(out.numpy() for out in self._predict(*inputs))

    def beside(self, other: "FrozenNetwork") -> Callable[..., tuple[tuple[np.ndarray, ...],
                                                                    np.ndarray]]:
        """`f(*inputs)`: `other`'s outputs and this network's first output on the same
        inputs, in one compiled call (Double DQN values each minibatch's next observations
        with the target and the online network: one call instead of two spares a call's fixed
        cost, about a tenth of a small net's DQN update on 2 cores)."""
        both = tf.function(lambda *x: (other.call(*x), self._predict_fn(*x)[0]),
                           autograph=False).get_concrete_function(*self._inputs)

        def predict(*inputs: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
            others, mine = both(*inputs)
            return tuple(out.numpy() for out in others), mine.numpy()
        return predict

    def frozen_copy(self) -> "FrozenNetwork":
        """A copy of the network that only infers, with today's weights (DQN's target network)."""
        copy = FrozenNetwork(self._build(self._obs_shape), self._inputs, self.recurrent,
                             self.sizes)
        copy.load(self.get_weights())
        return copy

    def gradients(self, batch: Batch) -> tuple[np.ndarray, dict[str, float], np.ndarray | None]:
        """The flat gradient, the statistics, and the loss's figure per data point where the
        algorithm has one (prioritized replay's TD errors; else None). The gradient is a
        read-only view of the tensor TF computed, not a copy."""
        return self._call(self._gradients, self._arrays(batch))

    def fused_gradients(self, parts: list[Batch]) -> tuple[np.ndarray, dict[str, float],
                                                            list[np.ndarray | None]]:
        """`sync.virtual_fused`: the sum of the gradients of the process's virtual ranks on
        their minibatches `parts` (all of one size), the first rank's statistics (the ranks'
        mean gradient's norm), and each part's loss figure per data point, as `gradients`."""
        inputs = [np.concatenate(arrays) for arrays in zip(*map(self._arrays, parts))]
        flat, stats, per_sample = self._call(self._fused, inputs)
        return flat, stats, (np.split(per_sample, len(parts)) if per_sample is not None
                             else [None] * len(parts))

    def _arrays(self, batch: Batch) -> list[np.ndarray]:
        return [batch.obs, batch.actions.astype(np.int32),
                *[batch.targets[f].astype(np.float32) for f in self.algo.fields]]

    def _call(self, step, inputs: list[np.ndarray]
              ) -> tuple[np.ndarray, dict[str, float], np.ndarray | None]:
        flat, stats, per_sample = step(*inputs)
        self._grad = flat
        self._grad_view = np.asarray(flat)
        return (self._grad_view, dict(zip(STAT_NAMES, stats.numpy().tolist())),
                per_sample.numpy() if per_sample.shape[0] else None)

    @property
    def fuses(self) -> bool:
        return self._fused is not None

    def apply(self, flat_grad: np.ndarray) -> None:
        # A single rank hands back the very array `gradients` returned: apply its tensor, which
        # spares two copies of the whole gradient (a tenth of a Nature-CNN update on 2 cores).
        same = flat_grad is self._grad_view
        self._apply(self._grad if same else tf.constant(flat_grad, tf.float32))

    def schedule(self, frames: int) -> None:
        """Sets the learning rate for the next update, `frames` of the run's done."""
        o = self.cfg.optim
        if o.lr_schedule == "constant" and not o.warmup_frames:
            return
        self.optimizer.learning_rate.assign(scheduled_lr(
            o, self._base_lr, frames / self.cfg.run.max_frames, frames))

    @property
    def lr(self) -> float:
        return float(tf.keras.backend.get_value(self.optimizer.learning_rate))

    def get_weights(self) -> np.ndarray:
        return np.concatenate([v.numpy().ravel() for v in self.variables]).astype(np.float32)

    def set_weights(self, flat: np.ndarray) -> None:
        assign_flat(self.variables, self.sizes, flat)

    def share_root_state(self, broadcast) -> None:
        """Rank 0's weights and Adam state (fresh or resumed) on every rank that calls this
        with the job's broadcast."""
        self.set_weights(broadcast(self.get_weights()))
        self.set_optimizer_state([broadcast(a) for a in self.get_optimizer_state()])

    def get_moments(self) -> AdamMoments:
        return get_moments(self.optimizer)

    def set_moments(self, state: AdamMoments) -> None:
        set_moments(self.optimizer, state)

    def get_optimizer_state(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.optimizer.variables]

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        for v, a in zip(self.optimizer.variables, arrays):
            v.assign(a)


def assign_flat(variables: list[tf.Variable], sizes: list[int], flat: np.ndarray) -> None:
    """The variables' values from one flat vector, in the order `get_weights` writes them."""
    for v, part in zip(variables, np.split(flat, np.cumsum(sizes)[:-1])):
        v.assign(part.reshape(v.shape))


class FrozenNetwork:
    """Inference on weights of its own, replaced only by `load`: other threads may infer with
    it while the learner's weights change."""

    def __init__(self, model: tf.keras.Model, inputs: list[tf.TensorSpec], recurrent: int,
                 sizes: list[int]):
        self._variables = model.trainable_variables
        self._sizes = sizes
        self.call = lambda *x: model(list(x) if recurrent else x[0], training=False)
        self._predict = tf.function(self.call, autograph=False).get_concrete_function(*inputs)

    def load(self, flat: np.ndarray) -> None:
        assign_flat(self._variables, self._sizes, flat)

    def predict(self, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        """As `Learner.predict`."""
        return tuple(out.numpy() for out in self._predict(*inputs))
