"""A parameter-server rank: one slice of the weights and its Adam state, no simulators.

Server 0 leads: it decides each gradient's fate and sends the decisions, in order, to the
other servers, which carry them out on their slices. Synchronous (k-of-n): the first k
gradients computed on the current version make the next update (their mean, one Adam step);
a gradient computed on an older version is dropped, and its worker gets the current weights.
Asynchronous: every gradient is one Adam step on arrival; its staleness is the number of
updates between the version it was computed on and the one it is applied to.

A worker that stays silent for sync.timeout while server 0 waits for it (for the quorum, or
for its goodbye at the end) is left out and the others go on; the chief (rank 0) cannot be
left out, so then the job ends.
"""
from __future__ import annotations

import hashlib
import time
from collections import deque

import numpy as np

from ddrl.config import Config
from ddrl.distributed.ps import (
    APPLY,
    CONTROL,
    DATA,
    DROP,
    FINISH,
    GRAD,
    META,
    MOMENT,
    REPLY,
    SNAPSHOT,
    STATE,
    STATUS,
    VELOCITY,
    WEIGHTS,
    Layout,
    control_schema,
    interval_schema,
    meta_schema,
    quorum,
    split,
)
from ddrl.distributed.sync import bcast
from ddrl.distributed.waiting import Backoff, abort, wait_all
from ddrl.distributed.world import World
from ddrl.learner import Learner
from ddrl.optim import apply_step, get_moments, make_optimizer, set_moments
from ddrl.output import say


def serve(cfg: Config, world: World, obs_shape: tuple[int, ...], obs_dtype, num_actions: int) -> int:
    """A server rank's whole run, from the split that sets the workers apart (in step with
    their PsSync) to the end of the job; its exit code."""
    layout, _ = split(cfg, world)
    learner = Learner(cfg, obs_shape, obs_dtype, num_actions, workers=layout.workers)
    learner.share_root_state(lambda a: bcast(world.comm, a))
    return ParameterServer(cfg, world, layout).serve(learner)


class ParameterServer:
    def __init__(self, cfg: Config, world: World, layout: Layout):
        self.world = world
        self.workers = layout.workers
        self.index = world.rank - layout.workers
        self._cfg, self._layout, self._comm = cfg, layout, world.comm
        self._k = quorum(cfg.sync.aggregate, layout.workers)
        self._timeout = cfg.sync.timeout
        self.status = dict.fromkeys(STATUS.names, 0.0)
        self._sends: list = []
        # Per worker: its gradient buffer, its message awaiting a decision, its last `sent`.
        self._data: dict[int, np.ndarray] = {}
        self._inbox: dict[int, dict] = {}
        self._sent = np.zeros(layout.workers)
        # Since when each worker could have sent something: its last message or our last reply.
        self._free_since = np.full(layout.workers, time.monotonic())
        # Running totals of the interval figures; a reply sends the difference to the row of
        # `_marks` kept for that worker at its previous reply.
        self._interval = interval_schema(layout.workers, 0)
        self._totals = self._interval.empty()
        self._marks = np.zeros((layout.workers, self._totals.size))
        self._control = control_schema(layout.workers)

    def serve(self, learner: Learner) -> int:
        """Hold rank 0's weights and Adam state for this slice (as broadcast into `learner`)
        until every worker has left."""
        import tensorflow as tf

        lo, hi = self._layout.bounds(learner.num_params)[self.index]
        self._var = tf.Variable(learner.get_weights()[lo:hi])
        self._opt = make_optimizer(self._cfg.optim, self.workers)
        self._opt.build([self._var])
        set_moments(self._opt, learner.get_moments().slice(lo, hi))
        # The same step as Learner.apply's, on this slice.
        self._step = tf.function(
            lambda g: apply_step(self._opt, [g], [self._var]), autograph=False,
            input_signature=[tf.TensorSpec((hi - lo,), tf.float32)])
        self._weights = self._var.numpy()
        if self.index == 0:
            self._lead()
        else:
            self._follow()
        wait_all(self._sends, self._timeout)
        st = self.status
        # Before the barrier: output written just before a rank exits can be lost by mpirun.
        say(f"[ddrl] parameter server {self.index} (rank {self.world.rank}) weights [{lo}, {hi}): "
            f"{st['version']:.0f} updates, {st['received']:.0f} gradients received, "
            f"{st['applied']:.0f} applied, {st['dropped']:.0f} dropped; final weights sha256 "
            f"{hashlib.sha256(self._weights.tobytes()).hexdigest()}")
        self.world.barrier()  # with the workers, once rank 0 has saved
        return 0

    def _lead(self) -> None:
        from mpi4py import MPI

        live, lost = set(range(self.workers)), set()
        pending: list[int] = []  # synchronous: gradients on the current version, short of k
        byes: dict[int, bool] = {}  # worker -> wants the Adam state back
        self._free_since[:] = time.monotonic()
        probe, backoff = MPI.Status(), Backoff()
        while live:
            self._prune_sends()
            if not self._comm.Iprobe(MPI.ANY_SOURCE, META, probe):
                if not self._expire(live, lost, pending, byes):
                    backoff.sleep()
                    continue
            else:
                backoff.reset()
                start = time.perf_counter()
                w, meta = self._receive(probe)
                if w in lost:
                    lost.discard(w)
                    live.add(w)
                    say(f"[ddrl] parameter server 0: worker rank {w} is back")
                kind = int(meta["kind"])
                if kind == GRAD:
                    self._inbox[w] = meta
                    if not meta["finite"]:
                        self._decide(DROP, [w])
                    elif self._cfg.sync.async_:
                        self._decide(APPLY, [w])
                    elif meta["version"] == self.status["version"]:
                        pending.append(w)
                    else:
                        self._decide(DROP, [w])
                elif kind == STATE:
                    self._decide(SNAPSHOT, [w])
                else:
                    byes[w] = bool(meta["want_state"])
                    live.discard(w)
                self.status["t_busy"] += time.perf_counter() - start
            # The quorum shrinks with the workers still there, so leaving never blocks an update.
            if pending and len(pending) >= min(self._k, len(live)):
                start = time.perf_counter()
                self._decide(APPLY, pending)
                pending = []
                self.status["t_busy"] += time.perf_counter() - start
            self.status["lost"] = len(lost)
        self._decide(FINISH, sorted(byes), byes)

    def _expire(self, live: set[int], lost: set[int], pending: list[int],
                byes: dict[int, bool]) -> bool:
        """Leave out the workers that server 0 waits for and that stayed silent too long."""
        if not pending and not byes:
            return False
        now = time.monotonic()
        silent = sorted(w for w in live
                        if w not in pending and now - self._free_since[w] > self._timeout)
        for w in silent:
            if w == 0:
                abort(self._comm, f"the chief (rank 0) sent nothing for {self._timeout:g} s "
                                  "(sync.timeout); ending the job")
            live.discard(w)
            lost.add(w)
            say(f"[ddrl] parameter server 0: worker rank {w} sent nothing for "
                f"{self._timeout:g} s (sync.timeout); going on with {len(live)} worker(s)")
        return bool(silent)

    def _follow(self) -> None:
        from mpi4py import MPI

        ctl = self._control
        control = ctl.empty()
        request = self._comm.Irecv(control, self._layout.server_rank(0), CONTROL)
        decisions: deque[tuple[int, list[int]]] = deque()
        byes: dict[int, bool] = {}
        probe, backoff = MPI.Status(), Backoff()
        since = time.monotonic()
        while True:
            self._prune_sends()
            start = time.perf_counter()
            busy = False
            if self._comm.Iprobe(MPI.ANY_SOURCE, META, probe):
                w, meta = self._receive(probe)
                if int(meta["kind"]) == GRAD:
                    self._inbox[w] = meta
                else:
                    byes[w] = bool(meta["want_state"])
                busy = True
            if request.Test():
                n = int(ctl.get(control, "count"))
                decisions.append((int(ctl.get(control, "op")), ctl.get(control, "workers")[:n].tolist()))
                self.status["bytes_in"] += control.nbytes
                request = self._comm.Irecv(control, self._layout.server_rank(0), CONTROL)
                busy = True
            while decisions and self._ready(*decisions[0], byes):
                op, workers = decisions.popleft()
                self._do(op, workers, byes)
                since = time.monotonic()
                if op == FINISH:
                    request.Cancel()
                    request.Wait()
                    return
            if busy:
                self.status["t_busy"] += time.perf_counter() - start
                backoff.reset()
                continue
            if not decisions:
                since = time.monotonic()
            elif time.monotonic() - since > self._timeout:
                abort(self._comm, f"parameter server {self.index}: waited {self._timeout:g} s "
                                  f"(sync.timeout) for messages of worker rank(s) "
                                  f"{decisions[0][1]} that server 0 already had; ending the job")
            backoff.sleep()

    def _ready(self, op: int, workers: list[int], byes: dict[int, bool]) -> bool:
        if op in (APPLY, DROP):
            return all(w in self._inbox for w in workers)
        if op == FINISH:
            return all(w in byes for w in workers)
        return True

    def _decide(self, op: int, workers: list[int], byes: dict[int, bool] | None = None) -> None:
        """Server 0: tell the other servers first (they may be waiting), then do it here."""
        if self._layout.servers > 1:
            msg = self._control.pack(op=op, count=len(workers), workers=workers)
            for s in range(1, self._layout.servers):
                self._sends.append(self._comm.Isend(msg, self._layout.server_rank(s), CONTROL))
                self.status["bytes_out"] += msg.nbytes
        self._do(op, workers, byes)

    def _do(self, op: int, workers: list[int], byes: dict[int, bool] | None) -> None:
        if op == APPLY:
            self._apply(sorted(workers))
        elif op == DROP:
            self._inbox.pop(workers[0])
            self.status["dropped"] += 1
            self._interval.add(self._totals, "dropped", 1)
        for w in workers:
            if op == SNAPSHOT:
                self._reply(w, state=True, interval=False)
            else:
                self._reply(w, state=op == FINISH and byes[w])

    def _apply(self, workers: list[int]) -> None:
        start = time.perf_counter()
        grad = self._data[workers[0]]
        if len(workers) > 1:
            grad = grad.copy()
            for w in workers[1:]:
                grad += self._data[w]
            grad /= len(workers)
        self._step(grad)
        self._weights = self._var.numpy()
        staleness = sum(self.status["version"] - self._inbox.pop(w)["version"] for w in workers)
        self.status["version"] += 1
        self.status["applied"] += len(workers)
        self.status["staleness_sum"] += staleness
        self._interval.add(self._totals, "contributors", len(workers))
        self._interval.add(self._totals, "staleness", staleness)
        self._interval.get(self._totals, "applied")[workers] += 1
        self.status["t_apply"] += time.perf_counter() - start

    def _receive(self, probe) -> tuple[int, dict]:
        """The META a probe found, and for a gradient its DATA, which the worker sent with it."""
        from mpi4py import MPI

        w = probe.Get_source()
        self._free_since[w] = time.monotonic()
        buf = np.empty(probe.Get_count(MPI.DOUBLE))
        self._comm.Recv(buf, w, META)
        self.status["bytes_in"] += buf.nbytes
        meta = meta_schema(buf.size - meta_schema(0).size).unpack(buf)
        self._sent[w] = meta["sent"]
        self.status["sent"] = self._sent.sum()
        if int(meta["kind"]) == GRAD:
            if w not in self._data:
                self._data[w] = np.empty(self._weights.size, np.float32)
            data = self._data[w]
            if not wait_all([self._comm.Irecv(data, w, DATA)], self._timeout):
                abort(self._comm, f"parameter server {self.index}: worker rank {w} sent a "
                                  f"gradient's header but not its data within {self._timeout:g} s")
            self.status["bytes_in"] += data.nbytes
            self.status["received"] += 1
            self._interval.get(self._totals, "reports")[w] += 1
        self._add_extras(meta["extras"])
        return w, meta

    def _add_extras(self, extras: np.ndarray) -> None:
        if not extras.size:
            return
        if self._interval.get(self._totals, "extras").size != extras.size:
            # The first side channel sets its size (the trainer's never changes).
            self._interval = interval_schema(self.workers, extras.size)
            grow = self._interval.size - self._totals.size
            self._totals = np.pad(self._totals, (0, grow))
            self._marks = np.pad(self._marks, ((0, 0), (0, grow)))
        self._interval.add(self._totals, "extras", extras)

    def _reply(self, w: int, state: bool = False, interval: bool = True) -> None:
        """Status (+ the interval figures) and the weight slice (+ the Adam moments)."""
        self.status["iterations"] = float(self._opt.iterations.numpy())
        meta = STATUS.pack(**self.status)
        if interval:
            meta = np.concatenate([meta, self._totals - self._marks[w]])
            self._marks[w] = self._totals
        out = [(meta, REPLY), (self._weights, WEIGHTS)]
        if state:
            adam = get_moments(self._opt)
            out += [(adam.m, MOMENT), (adam.v, VELOCITY)]
        for buf, tag in out:
            self._sends.append(self._comm.Isend(buf, w, tag))
            self.status["bytes_out"] += buf.nbytes
        self._free_since[w] = time.monotonic()

    def _prune_sends(self) -> None:
        # A send to a worker that died never completes; it is dropped with the process.
        self._sends = [r for r in self._sends if not r.Test()]
