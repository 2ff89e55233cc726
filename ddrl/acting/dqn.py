"""DQN's node: epsilon-greedy samplers, a replay memory, a target network, and the two
techniques of the concurrent-DQN paper (papers/dqn-concurrent-synchronized.txt) as options.

Standard (dqn.concurrent = false): the samplers act with the learner's current weights, and
every dqn.train_period agent steps the trainer takes one minibatch; every dqn.target_period
steps the target network takes the learner's weights.

Concurrent: at each target update a sampler thread starts on the next target_period steps,
acting with the target network, while the trainer trains on target_period / train_period
minibatches of the memory as it was; the sampler's experience waits in a buffer and enters
the memory only when both are done (the paper's Algorithm 1). Every period thus trains on the
same data and acts with the same weights whatever the threads' timing, so runs reproduce.

Synchronized (dqn.synchronized = true): the dqn.samplers simulators step in lock-step in
one vector env, one batched inference per step; otherwise each has a thread of its own that
infers alone. One "round" steps every simulator once.
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from ddrl.acting.base import Actors
from ddrl.acting.policy import RecurrentState
from ddrl.acting.prioritized import PrioritizedReplay
from ddrl.acting.replay import ReplayMemory
from ddrl.acting.sequences import PrioritizedSequences, SequenceReplay
from ddrl.algos.base import ReplayAlgorithm
from ddrl.algos.batch import Batch
from ddrl.algos.dqn import epsilon
from ddrl.config import Config
from ddrl.cpus import available_memory
from ddrl.envs import SimPool
from ddrl.errors import DdrlError
from ddrl.learner import Learner
from ddrl.output import PhaseProgress, say
from ddrl.rundir import checkpoint

Predict = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
PREPOPULATE_CHUNK = 256


def epsilon_greedy(rng: np.random.Generator, obs: np.ndarray, n_actions: int,
                   predict: Predict | None, eps: float, infer_all: bool = False) -> np.ndarray:
    """An action per observation: uniformly random with probability `eps` (always where
    `predict` is None), else the argmax of the first output; only the greedy rows infer,
    unless `infer_all` (a recurrent network's state follows every observation)."""
    actions = rng.integers(0, n_actions, len(obs)).astype(np.int32)
    if predict is not None:
        greedy = rng.random(len(obs)) >= eps
        if infer_all:
            actions[greedy] = predict(obs)[0][greedy].argmax(-1)
        elif greedy.any():
            actions[greedy] = predict(obs[greedy])[0].argmax(-1)
    return actions


@dataclass
class Experience:
    """Steps not yet in the replay memory, in the order they are to enter it."""
    steps: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    # (streams, first observations) of simulators seen for the first time (central mode):
    # they enter the memory before any step, each stream's begin before its own steps.
    begins: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    episodes: list[tuple[int, float, int]] = field(default_factory=list)
    frames: int = 0
    t_sim: float = 0.0
    t_predict: float = 0.0

    @property
    def transitions(self) -> int:
        return sum(len(step[0]) for step in self.steps)

    def extend(self, other: "Experience") -> None:
        self.steps += other.steps
        self.begins += other.begins
        self.episodes += other.episodes
        self.frames += other.frames
        self.t_sim += other.t_sim
        self.t_predict += other.t_predict


class Samplers:
    """The node's simulators, each a stream of the replay memory."""

    def __init__(self, node: Actors, cfg: Config):
        w = cfg.dqn.samplers
        self._node = node
        synchronized = cfg.dqn.synchronized or w == 1
        if synchronized:
            self._pools = [node.make_pool("sampler", w)]
        else:
            self._pools = [node.make_pool(f"sampler{j}", 1) for j in range(w)]
        self.size = w
        self._offsets = np.cumsum([0] + [p.num_envs for p in self._pools])[:-1]
        self._rngs = [node.rng(f"explore{j}") for j in range(len(self._pools))]
        self._threads = None if synchronized else ThreadPoolExecutor(
            w, thread_name_prefix="ddrl-sampler")
        # Set when the node closes: a sampler thread mid-period stops within a round instead
        # of playing out the period (minutes at Table 5's 10,000 steps).
        self.stopped = threading.Event()
        # R2D2: each simulator's recurrent state, carried across `collect` calls.
        recurrent = node.learner.recurrent
        self._states = [RecurrentState(p.num_envs, recurrent) for p in self._pools]
        self.n_actions = self._pools[0].n_actions
        self.obs_shape = self._pools[0].obs_shape
        self.obs_dtype = self._pools[0].backend.obs_dtype
        self._obs: list[np.ndarray] = []
        self._starts: list[np.ndarray | None] = [None] * len(self._pools)
        first = []
        for j, pool in enumerate(self._pools):
            step = pool.recv()
            order = np.argsort(step.env_ids, kind="stable")
            self._obs.append(step.obs[order])
            first.append((self._offsets[j] + step.env_ids[order], step.obs[order]))
        self.first = (np.concatenate([s for s, _ in first]), np.concatenate([o for _, o in first]))

    def collect(self, rounds: int, predict: Predict | None, eps: float, acted_at: int
                ) -> Experience:
        """`rounds` steps of every simulator; `predict` None acts uniformly at random."""
        if self._threads is None:
            return self._collect(0, rounds, predict, eps, acted_at)
        parts = list(self._threads.map(lambda j: self._collect(j, rounds, predict, eps, acted_at),
                                       range(len(self._pools))))
        out = Experience()
        for part in parts:
            out.extend(part)
        return out

    def _collect(self, j: int, rounds: int, predict: Predict | None, eps: float,
                 acted_at: int) -> Experience:
        pool: SimPool = self._pools[j]
        rng, out, state = self._rngs[j], Experience(), self._states[j]
        obs, starts = self._obs[j], self._starts[j]
        for _ in range(rounds):
            if self.stopped.is_set():
                break
            t0 = time.perf_counter()
            state.reset(starts)
            acted_on = state.state() if state.units else None
            actions = epsilon_greedy(
                rng, obs, self.n_actions,
                predict and (lambda o, predict=predict: state.step(predict, o)), eps,
                infer_all=bool(state.units))
            t1 = time.perf_counter()
            pool.send(actions)
            step = pool.recv()
            t2 = time.perf_counter()
            order = np.argsort(step.env_ids, kind="stable")
            step.reorder(order)
            reward = self._node.bootstrap_truncated(step, predict, state, step.truncated)
            out.steps.append((self._offsets[j] + step.env_ids, actions, reward, step.done,
                              np.full(len(actions), acted_at), step.obs,
                              *((acted_on,) if state.units else ())))
            out.episodes += step.episodes
            out.frames += len(actions) * pool.frames_per_step
            obs, starts = step.obs, step.done
            out.t_predict += t1 - t0 + time.perf_counter() - t2
            out.t_sim += t2 - t1
        self._obs[j], self._starts[j] = obs, starts
        return out

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown()
        for pool in self._pools:
            pool.close()


class DQNActors(Actors):
    def __init__(self, cfg: Config, learner: Learner, rank: int, restart: int,
                 samplers: Callable[["DQNActors"], Samplers] = lambda node: Samplers(node, node.cfg)):
        """`samplers` makes the simulators' side from the node (central mode: the actor
        ranks')."""
        super().__init__(cfg, learner, rank, restart)
        a = cfg.dqn
        # make_algorithm gives a DQN job the replay family.
        self.algo: ReplayAlgorithm = learner.algo
        self.samplers = samplers(self)
        shape = (a.replay_frames, self.samplers.size, self.samplers.obs_shape,
                 self.samplers.obs_dtype, cfg.is_atari)
        if a.recurrent:
            sequences = (*shape, a.recurrent, a.sequence_period, self.algo.sequence + a.n_step)
            self.memory = (PrioritizedSequences(*sequences, a.priority_alpha, a.priority_beta)
                           if a.prioritized else SequenceReplay(*sequences))
        elif a.prioritized:
            self.memory = PrioritizedReplay(*shape, a.n_step, a.priority_alpha, a.priority_beta)
        else:
            self.memory = ReplayMemory(*shape)
        # Where the last minibatch came from, and its per-sample errors once learned on: its
        # priorities follow its gradient.
        self._sampled: np.ndarray | None = None
        self._errors: np.ndarray | None = None
        self._restored = False
        if rank == 0:
            # np.zeros reserves the pages; they are touched (and resident) as the memory fills.
            sequences = (f", sequences of {a.burn_in} burn-in + {a.sequence} + {a.n_step} steps "
                         f"every {a.sequence_period}" if a.recurrent else "")
            say(f"[ddrl] replay memory: {a.replay_frames:,} frames in {self.samplers.size} "
                f"stream(s){sequences}, {self.memory.nbytes / 2**30:.2f} GiB per rank when full")
        self.target = learner.frozen_copy()
        self._both = learner.beside(self.target) if a.double else None
        self._rng = self.rng("replay")
        # Agent steps taken and not yet paid for by a minibatch (standard mode), and the
        # minibatches left in this target period (concurrent mode).
        self._credit = 0
        self._since_target = 0
        self._left = 0
        # A future, not a bare thread: an exception in the sampler reaches the trainer at
        # the next period instead of leaving it training on a memory that stopped growing.
        self._sampler_thread = ThreadPoolExecutor(1, thread_name_prefix="ddrl-dqn-sampler")
        self._sampler: Future | None = None

    def check_memory(self, local_ranks: int) -> None:
        need = self.memory.nbytes * local_ranks
        available = available_memory()
        if available is not None and need > available:
            raise DdrlError(
                f"config key dqn.replay_frames: {self.cfg.dqn.replay_frames:,} frames need "
                f"{self.memory.nbytes / 2**30:.2f} GiB per rank, {need / 2**30:.2f} GiB for "
                f"this node's {local_ranks} rank(s), and it has {available / 2**30:.2f} GiB "
                "available: lower it, or run fewer ranks per node")

    def start(self, stopping) -> None:
        """Prepopulation with uniformly random actions; at least n + 1 rounds, so that every
        stream has a transition with its n following steps. A stop signal cuts it short
        (the first update then carries the stop to every rank). A memory restored from a
        run stopped during its prepopulation is filled up to dqn.prepopulate. A resumed run
        whose memory was not kept refills it as its training would: the restored weights
        acting at the schedule's epsilon; random play would fill the memory with a beginner's
        games and log them as the agent's."""
        # The simulators start new games: in a restored memory too, each stream goes on
        # with a new game's stack.
        self.memory.begin(*self.samplers.first)
        a = self.cfg.dqn
        missing = max(a.prepopulate, self.cfg.acting.batch_size) - self.memory.transitions
        if self._restored and missing <= 0:
            return
        rounds = max(math.ceil(missing / self.samplers.size), self.memory.steps_needed(a.n_step))
        eps = self._epsilon() if self.update else 1.0
        predict = self.learner.predict if eps < 1.0 else None
        acting = f" (the agent at epsilon {eps:.3g})" if predict else ""
        progress = PhaseProgress(f"rank {self.rank} prepopulating the replay memory{acting}",
                                 rounds * self.samplers.size, "transitions",
                                 self.cfg.run.progress_seconds if self.rank == 0 else 0)
        # In chunks: a buffered step holds whole observation stacks, four times what the
        # memory keeps of it.
        needed = self.memory.steps_needed(a.n_step)
        for chunk in range(0, rounds, PREPOPULATE_CHUNK):
            # Not before every stream has a transition to draw: the first minibatch follows.
            if chunk >= needed and stopping():
                return
            progress.update(chunk * self.samplers.size)
            self._store(self.samplers.collect(min(PREPOPULATE_CHUNK, rounds - chunk), predict,
                                              eps, self.update))

    def _replay_path(self, directory: Path) -> Path:
        return directory / f"replay-rank{self.rank}.npz"

    def save_state(self, directory: Path, update: int) -> None:
        """The memory as it is after `close()`; steps a concurrent sampler had not yet
        flushed into it (at most one target period) are not in it."""
        if not self.cfg.dqn.save_replay:
            return
        t0 = time.perf_counter()
        if self.rank == 0:
            say(f"[ddrl] saving the replay memory: {self.memory.transitions:,} transitions, "
                f"{self.memory.nbytes / 2**30:.2f} GiB per rank")
        checkpoint.write_arrays(self._replay_path(directory), {
            "update": np.int64(update), "since_target": np.int64(self._since_target),
            "credit": np.int64(self._credit), **self.memory.state()})
        if self.rank == 0:
            say(f"[ddrl] replay memory saved: {self.memory.transitions:,} transitions, "
                f"{self.memory.nbytes / 2**30:.2f} GiB per rank in {time.perf_counter() - t0:.1f} s")

    def restore_state(self, directory: Path, update: int) -> None:
        if not self.cfg.dqn.save_replay:
            return
        path = self._replay_path(directory)
        try:
            saved = checkpoint.read_arrays(path)
            saved_update = int(saved.get("update", -1))
            if saved_update != update:
                raise ValueError(f"it is of update {saved_update}, the checkpoint "
                                 f"of update {update} (a periodic one, after a failure)")
            # All checked before the memory takes any over: a file cut short of one array
            # must leave the memory as it was, not half replaced.
            missing = sorted({"since_target", "credit", *self.memory.state()} - saved.keys())
            if missing:
                raise ValueError(f"{', '.join(missing)} missing")
            self.memory.restore(saved, self.cfg.dqn.n_step)
        except (DdrlError, ValueError) as exc:
            say(f"[ddrl] rank {self.rank}: replay memory not restored ({exc}): prepopulating "
                "a new one", err=True)
            return
        self._since_target, self._credit = int(saved["since_target"]), int(saved["credit"])
        self._restored = True
        if self.rank == 0:
            say(f"[ddrl] replay memory restored: {self.memory.transitions:,} transitions "
                f"from {path.name}")

    def _store(self, exp: Experience) -> None:
        for streams, obs in exp.begins:
            self.memory.begin(streams, obs)
        for step in exp.steps:
            self.memory.add(*step)
        self.record(exp.frames, exp.episodes)
        with self._lock:
            self.t_sim += exp.t_sim
            self.t_predict += exp.t_predict

    def bootstrap_truncated(self, step, predict=None, state: RecurrentState | None = None,
                            rows=None) -> np.ndarray:
        """With max_a Q in reward units: a rescaled Q's h^-1, and never a categorical head's
        second output (its distribution). A recurrent network values the cut games' last
        observations from the states of their simulators (`rows` of `state`)."""
        predict = predict or self.learner.predict
        if state is not None:
            predict = partial(state.peek, predict, rows=rows)
        value = self.algo.state_value
        return super().bootstrap_truncated(step, lambda obs: (None, value(predict(obs)[0])))

    def _epsilon(self) -> float:
        return epsilon(self.cfg, self.update * self.cfg.dqn.train_period)

    def next_batch(self) -> Batch:
        if self.cfg.dqn.prioritized:
            # Before anything enters the memory: the sampled slots still hold what was sampled.
            if self._sampled is not None and self._errors is not None:
                self.memory.update(self._sampled, self._errors)
            self.memory.anneal(self.progress)
        if self.cfg.dqn.concurrent:
            self._concurrent_period()
        else:
            self._standard_steps()
        return self._minibatch()

    def learned(self, per_sample: np.ndarray | None) -> None:
        self._errors = per_sample

    def _standard_steps(self) -> None:
        a = self.cfg.dqn
        while self._credit < a.train_period:
            exp = self.samplers.collect(1, self.learner.predict, self._epsilon(), self.update)
            self._store(exp)
            if not exp.transitions:
                break  # the samplers stopped (the run ends)
            self._credit += exp.transitions
            self._since_target += exp.transitions
        self._credit -= a.train_period
        if self._since_target >= a.target_period:
            self._since_target -= a.target_period
            self.target.load(self.learner.get_weights())

    def _concurrent_period(self) -> None:
        a = self.cfg.dqn
        self._left -= 1
        if self._left >= 0:
            return
        if self._sampler is not None:
            self._store(self._sampler.result())
        self.target.load(self.learner.get_weights())
        rounds = math.ceil(a.target_period / self.samplers.size)
        self._sampler = self._sampler_thread.submit(
            self.samplers.collect, rounds, self.target.predict, self._epsilon(), self.update)
        self._left = a.target_period // a.train_period - 1

    def _minibatch(self) -> Batch:
        t0 = time.perf_counter()
        t = self._sample()
        batch = self.algo.replay_batch(t, self._next_values)
        self._sampled = t.index
        with self._lock:
            self.t_predict += time.perf_counter() - t0
        return batch

    def _sample(self):
        try:
            return self.memory.sample(self.cfg.acting.batch_size, self.cfg.dqn.n_step, self._rng)
        except ValueError as exc:
            raise DdrlError(f"rank {self.rank}: no minibatch can be drawn: {exc} (raise "
                            "dqn.prepopulate or lower dqn.n_step)") from None

    def _next_values(self, *inputs: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """The target network's outputs, and the Q whose argmax is the bootstrap's action:
        the online network's (Double DQN) or the target's."""
        if self._both is not None:
            return self._both(*inputs)
        out = self.target.predict(*inputs)
        return out, out[0]

    def close(self) -> None:
        self.samplers.stopped.set()
        if self._sampler is not None:
            self._sampler.result()
        self._sampler_thread.shutdown()
        self.samplers.close()
