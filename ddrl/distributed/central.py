"""Central inference (SEED RL, `sync.mode = "central"`): actor ranks run simulators and no
network; rank 0, the learner, infers for all of them and trains. One model copy in the job,
and nothing the size of the model crosses the network: observations go to the learner,
actions come back.

Actor side (`run_actor`): each actor rank steps `central.groups` groups of `acting.n_sim`
simulators; while one group waits for its actions the others step, so the rank's cores do
not idle. For each group step it sends one OBS_META (float64, `obs_meta_schema`) and one
OBS_DATA (the observations as raw bytes, Atari stacks as their newest frame where the learner
holds the rest: ddrl/distributed/frames.py), then waits for that group's ACTIONS (int32, tag
ACTIONS + group).

Learner side (`RemotePool`): a simulator pool whose simulators are on the actor ranks. Its
`recv()` is the inference batcher: it takes the actors' steps as they come and closes a batch
when it holds `central.batch` observations or `central.deadline_ms` after its first, so no
actor waits long; `send(actions)` routes each action back. The ba3c node's predictor thread
drives it exactly as it drives a local pool, so unrolls, acting log-probabilities and values,
the FIFO and V-trace are the ones every other mode uses.

An actor silent for `sync.timeout` is left out and the run goes on with the others; the
learner ends the job after it has saved (the lost rank may hang, and only MPI_Abort ends
it). An actor that hears nothing from the learner for 2 x `sync.timeout` + 10 s ends the
job: the learner is gone.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddrl.config import Config
from ddrl.distributed.frames import StackReceiver, StackSender
from ddrl.distributed.schema import Schema
from ddrl.distributed.sync import LocalSync, bcast
from ddrl.distributed.waiting import Backoff, abort, wait_all
from ddrl.distributed.world import World
from ddrl.envs import Step, make_pool
from ddrl.errors import DdrlError
from ddrl.output import say
from ddrl.seeding import derive_seed, rng
from ddrl.signals import freeze

# Message tags; each (source, tag) pair is FIFO in MPI. A group's actions come on
# ACTIONS + group, so the replies to several groups in flight cannot be confused.
OBS_META, OBS_DATA, STOP, HEARTBEAT, ACTIONS = 41, 42, 43, 44, 100
LEARNER = 0
# The STOP an actor gets when the learner left it out: it stops and waits for the job's end.
LEFT_OUT = -1

# The fixed head of every OBS_META; the per-simulator blocks and the finished games follow.
OBS_HEAD = Schema("group", "n", "games", "truncated", "frames", "t_sim", "t_idle", "t_round",
                  "rounds")


def obs_meta_schema(n: int, games: int) -> Schema:
    """n simulators' ids (local to the group), rewards, dones, truncation flags and which
    observations go whole (`StackSender`); per finished game its simulator, return and
    length."""
    return Schema(*OBS_HEAD.names, ("env_ids", n), ("reward", n), ("done", n),
                  ("truncated_mask", n), ("whole", n), ("games_env", games),
                  ("games_return", games), ("games_length", games))


def is_actor(cfg: Config, world: World) -> bool:
    return cfg.sync.mode == "central" and world.rank != LEARNER


def check(cfg: Config, world_size: int) -> None:
    if world_size < 2:
        raise DdrlError(f"sync.mode = 'central' needs a learner and at least one actor rank, "
                        f"got {world_size} rank(s)")


def split(world: World) -> Any:
    """This rank's part of the split into the learner and the actors (every rank calls it:
    the split is collective)."""
    return world.comm.Split(0 if world.rank == LEARNER else 1, world.rank)


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


# ---------------------------------------------------------------- actor ranks


class _Group:
    """One group of simulators with at most one step in flight to the learner."""

    def __init__(self, index: int, pool, stacked: bool):
        self.index = index
        self.pool = pool
        self.sender = StackSender(pool.num_envs, stacked)
        self.actions = np.zeros(pool.num_envs, np.int32)
        self.request = None
        self.sent_at = 0.0


def run_actor(cfg: Config, world: World, restart: int) -> int:
    """An actor rank's whole run: simulators only, until the learner says stop."""
    from mpi4py import MPI

    comm = world.comm
    groups = [_Group(g, make_pool(cfg, cfg.acting.n_sim,
                                  derive_seed(cfg.run.seed, world.rank, f"actor{g}/{restart}"),
                                  train=True,
                                  rng=rng(cfg.run.seed, world.rank, f"actor{g}/{restart}/decorrelate")),
                     stacked=cfg.is_atari)
              for g in range(cfg.central.groups)]
    stop, beat = np.zeros(1, np.int64), np.zeros(1, np.int64)
    stop_request = comm.Irecv(stop, LEARNER, STOP)
    beat_request = comm.Irecv(beat, LEARNER, HEARTBEAT)
    sends: list = []
    frames, games, steps_sent, t_sim, t_idle, t_round, rounds = 0, 0, 0, 0.0, 0.0, 0.0, 0
    deadline = 2 * cfg.sync.timeout + 10
    backoff = Backoff(spin=1e-3)

    def step_and_send(group: _Group, first: bool) -> None:
        nonlocal frames, games, steps_sent, t_sim, t_round, rounds
        frozen = world.rank == cfg.debug.freeze_rank and steps_sent == cfg.debug.freeze_update
        if frozen and not cfg.debug.freeze_mid_step:
            freeze(cfg.debug.freeze_seconds)
        t0 = time.perf_counter()
        if not first:
            t_round += t0 - group.sent_at
            rounds += 1
            group.pool.send(group.actions)
        step: Step = group.pool.recv()
        t_sim += time.perf_counter() - t0
        n = len(step.env_ids)
        frames += n * group.pool.frames_per_step
        games += len(step.episodes)
        ep = np.array(step.episodes, np.float64).reshape(-1, 3)
        # A done step's observation is the next game's first stack: it goes whole.
        whole, data = group.sender.encode(step.env_ids, step.obs, step.done)
        if step.final_obs is not None:
            data = np.concatenate([data, _bytes(step.final_obs)])
        meta = obs_meta_schema(n, len(ep)).pack(
            group=group.index, n=n, games=len(ep), truncated=int(step.truncated.sum()),
            frames=n * group.pool.frames_per_step, t_sim=t_sim, t_idle=t_idle, t_round=t_round,
            rounds=rounds,
            env_ids=step.env_ids, reward=step.reward, done=step.done,
            truncated_mask=step.truncated, whole=whole, games_env=ep[:, 0],
            games_return=ep[:, 1], games_length=ep[:, 2])
        group.request = comm.Irecv(group.actions[:n], LEARNER, ACTIONS + group.index)
        sends.append(comm.Isend(meta, LEARNER, OBS_META))
        if frozen and cfg.debug.freeze_mid_step:  # fault injection: hung between the two sends
            sends[-1].Wait()
            freeze(cfg.debug.freeze_seconds)
        sends.append(comm.Isend(data, LEARNER, OBS_DATA))
        steps_sent += 1
        group.sent_at = time.perf_counter()

    for group in groups:
        step_and_send(group, first=True)
    last_heard = time.monotonic()
    while not stop_request.Test():
        sends = [r for r in sends if not r.Test()]
        ready = [g for g in groups if g.request.Test()]
        for group in ready:
            step_and_send(group, first=False)
        if ready:
            last_heard = time.monotonic()
            backoff.reset()
            continue
        if beat_request.Test():  # the learner, still starting, is alive
            last_heard = time.monotonic()
            beat_request = comm.Irecv(beat, LEARNER, HEARTBEAT)
        if time.monotonic() - last_heard > deadline:
            abort(comm, f"actor rank {world.rank}: no actions from the learner for "
                        f"{deadline:.0f} s (2 x sync.timeout + 10 s): the learner is gone")
        t0 = time.perf_counter()
        backoff.sleep()
        t_idle += time.perf_counter() - t0
    # The learner receives what is still on the way (it knows how much from the count),
    # so every send completes before MPI_Finalize.
    sends.append(comm.Isend(np.array([steps_sent], np.int64), LEARNER, STOP))
    for request in [g.request for g in groups] + [beat_request]:
        request.Cancel()
        request.Wait()
    MPI.Request.Waitall(sends)
    for group in groups:
        group.pool.close()
    if stop[0] == LEFT_OUT:
        say(f"[ddrl] actor rank {world.rank}: the learner left it out (silent for sync.timeout); "
            "it stops and the job ends once the learner has saved", err=True)
        stop[0] = 0
    loaded = "tensorflow" in sys.modules
    say(f"[ddrl] actor rank {world.rank}: {frames:,} frames, {games} games, "
        f"{cfg.central.groups} x {cfg.acting.n_sim} simulators, simulating {t_sim:.1f} s, "
        f"idle {t_idle:.1f} s; tensorflow loaded: {'yes' if loaded else 'no'}")
    world.barrier()  # with the learner, once it has saved
    return int(stop[0])


# ---------------------------------------------------------------- the learner rank


class StartupBeat:
    """The learner's start-up (TensorFlow's import, a replay memory restored from a slow
    shared filesystem) may outlast the actors' deadline for it (2 x sync.timeout + 10 s from
    their first step): until it serves them, a thread tells each actor every `every` seconds
    that it is alive. A learner frozen whole stops beating, and the deadline ends the job."""

    def __init__(self, world: World, every: float):
        self._comm, self._actors = world.comm, range(LEARNER + 1, world.size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,),
                                        name="ddrl-startup-beat", daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        beat, sends = np.zeros(1, np.int64), []
        while not self._stop.wait(every):
            # A frozen actor's beats stay pending; a few bytes each, for the start-up only.
            sends = [r for r in sends if not r.Test()]
            sends += [self._comm.Isend(beat, actor, HEARTBEAT) for actor in self._actors]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class _Request:
    actor: int  # index among the actor ranks (rank - 1)
    group: int
    env_ids: np.ndarray  # local to the actor


# The actor's cumulative clocks, as its headers carry them.
CLOCKS = ("t_sim", "t_idle", "t_round", "rounds")


@dataclass
class _ActorStats:
    """Since the last `/ranks` row: frames and what crossed the wire; the actor's clocks as
    its last message had them, and as they were at the last row."""
    frames: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    clocks: np.ndarray = field(default_factory=lambda: np.zeros(len(CLOCKS)))
    marked: np.ndarray = field(default_factory=lambda: np.zeros(len(CLOCKS)))
    # When its last step arrived or its last actions left, whichever is later.
    last_heard: float = field(default_factory=time.monotonic)
    steps_received: int = 0


class RemotePool:
    """The actor ranks' simulators as one pool (the SimPool interface) on the learner."""

    def __init__(self, cfg: Config, comm: Any, actors: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, n_actions: int, frames_per_step: int):
        # Each actor's groups are simulators of their own: group g of actor a holds the
        # learner's simulators (a * groups + g) * n_sim onwards.
        self._groups = cfg.central.groups
        self.num_envs = actors * self._groups * cfg.acting.n_sim
        self.n_actions = n_actions
        self.obs_shape = obs_shape
        self.frames_per_step = frames_per_step
        self._comm = comm
        self._n_sim = cfg.acting.n_sim
        self._dtype = self.obs_dtype = np.dtype(obs_dtype)
        self._frames = StackReceiver(self.num_envs, obs_shape, obs_dtype, stacked=cfg.is_atari)
        self._row = int(np.prod(obs_shape)) * self._dtype.itemsize
        self._batch = cfg.central.batch or max(1, self.num_envs // cfg.central.groups)
        self._deadline = cfg.central.deadline_ms / 1e3
        self._timeout = cfg.sync.timeout
        self._live = set(range(actors))
        self.lost: list[int] = []
        self._stats = [_ActorStats() for _ in range(actors)]
        self._serving = False
        self._served: list[_Request] = []
        self._sends: list = []
        self._abandoned: list = []  # receives given up on, with their buffers
        # Since the last `/inference` row: batches, observations in them, seconds gathering.
        self._batches, self._batched, self._t_gather = 0, 0, 0.0
        # Set before the node's predictor thread is joined: `recv` then returns an empty step.
        self.stopping = threading.Event()

    def recv(self) -> Step:
        """The next inference batch: at least one actor's step, up to `central.batch`
        observations, closed `central.deadline_ms` after its first step arrived."""
        from mpi4py import MPI

        parts: list[tuple[_Request, dict, np.ndarray, np.ndarray | None]] = []
        have, first_at, start = 0, None, time.perf_counter()
        status, backoff = MPI.Status(), Backoff(spin=1e-3)
        if not self._serving:
            # The actors' silence counts from the first batch the learner asks for, not
            # through its own start-up (a slow one is no actor's fault).
            self._serving = True
            for st in self._stats:
                st.last_heard = time.monotonic()
        self._expire()
        while have < self._batch and not self.stopping.is_set():
            if first_at is not None and time.monotonic() - first_at >= self._deadline:
                break
            self._sends = [r for r in self._sends if not r.Test()]
            if not self._comm.Iprobe(MPI.ANY_SOURCE, OBS_META, status):
                if first_at is None:
                    self._expire()
                backoff.sleep()
                continue
            backoff.reset()
            part = self._receive(status)
            if part is None:
                continue
            parts.append(part)
            have += len(part[0].env_ids)
            first_at = first_at or time.monotonic()
        self._served = [p[0] for p in parts]
        self._batches += 1
        self._batched += have
        self._t_gather += time.perf_counter() - start
        return self._step(parts)

    def send(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions, np.int32)
        offset = 0
        for req in self._served:
            n = len(req.env_ids)
            if req.actor in self._live:
                part = np.ascontiguousarray(actions[offset:offset + n])
                self._sends.append(self._comm.Isend(part, req.actor + 1, ACTIONS + req.group))
                st = self._stats[req.actor]
                st.bytes_out += part.nbytes
                # From now on the actor owes the next step: its silence counts from here.
                st.last_heard = time.monotonic()
            offset += n
        self._served = []

    def _receive(self, status):
        from mpi4py import MPI

        src = status.Get_source()
        meta_buf = np.empty(status.Get_count(MPI.DOUBLE))
        # Every receive has sync.timeout: an actor frozen mid-send, or a stalled link, would
        # otherwise hold inference for every actor.
        if not self._within(src, meta_buf, OBS_META):
            return None
        meta = self._checked_meta(src, meta_buf)
        actor = src - 1
        truncated = int(meta["truncated"])
        whole = meta["whole"].astype(bool)
        size = self._frames.nbytes(whole)
        data = np.empty(size + truncated * self._row, np.uint8)
        # Probed first: a shorter message would leave the rest of the buffer uninitialised.
        deadline, backoff = time.monotonic() + self._timeout, Backoff(spin=1e-3)
        while not self._comm.Iprobe(src, OBS_DATA, status):
            if time.monotonic() > deadline:
                self._leave_out(actor, "stopped between a step's head and its observations")
                return None
            backoff.sleep()
        if actor not in self._live:  # left out already: what it sends is dropped, unread
            data = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        elif status.Get_count(MPI.BYTE) != data.nbytes:
            raise DdrlError(f"central: actor rank {src} sent {status.Get_count(MPI.BYTE):,} bytes "
                            f"of observations where its step's head announces {data.nbytes:,}")
        if not self._within(src, data, OBS_DATA):
            return None
        st = self._stats[actor]
        st.last_heard = time.monotonic()
        st.steps_received += 1
        if actor not in self._live:
            return None  # its simulators' unrolls were dropped
        st.frames += meta["frames"]
        st.clocks[:] = [meta[name] for name in CLOCKS]
        st.bytes_in += meta_buf.nbytes + data.nbytes
        req = _Request(actor, int(meta["group"]), meta["env_ids"].astype(np.int64))
        obs = self._frames.decode(self._base(req) + req.env_ids, whole, data[:size])
        final = data[size:].view(self._dtype).reshape(truncated, *self.obs_shape)
        return req, meta, obs, (final if truncated else None)

    def _within(self, src: int, buf: np.ndarray, tag: int) -> bool:
        """A probed message received within sync.timeout; else its actor is left out (the
        buffer is kept: MPI may still write into it)."""
        request = self._comm.Irecv(buf, src, tag)
        if wait_all([request], self._timeout, spin=1e-3):
            return True
        self._abandoned.append((request, buf))
        self._leave_out(src - 1, "stopped in the middle of a message")
        return False

    def _leave_out(self, actor: int, why: str) -> None:
        if actor in self._live:
            self._live.discard(actor)
            self.lost.append(actor + 1)
            # Should it wake up, it learns it is out instead of waiting for actions and then
            # ending the job as if the learner were gone.
            self._sends.append(self._comm.Isend(np.array([LEFT_OUT], np.int64), actor + 1, STOP))
            say(f"[ddrl] central: actor rank {actor + 1} {why} for {self._timeout:g} s "
                f"(sync.timeout); going on with {len(self._live)} actor rank(s)", err=True)

    def _checked_meta(self, src: int, buf: np.ndarray) -> dict[str, np.ndarray]:
        """A step's head and blocks, once their sizes and ids are those an actor of this job
        can send: a wrong one would write into another simulator's frame stack."""
        def bad(what: str) -> DdrlError:
            return DdrlError(f"central: actor rank {src} sent a malformed step ({what}); is "
                             "every rank running the same ddrl and job file?")
        if not 0 < src <= len(self._stats) or len(buf) < len(OBS_HEAD.names):
            raise bad(f"{len(buf)} values from a rank that is no actor of this job"
                      if len(buf) >= len(OBS_HEAD.names) else f"a head of {len(buf)} values")
        head = OBS_HEAD.unpack(buf)
        n, games, group = (int(head[k]) for k in ("n", "games", "group"))
        if not 0 < n <= self._n_sim or games < 0 or not 0 <= group < self._groups:
            raise bad(f"{n} simulators, {games} games, group {group}; this job has "
                      f"{self._groups} groups of {self._n_sim}")
        schema = obs_meta_schema(n, games)
        if len(buf) != schema.size:
            raise bad(f"{len(buf)} values where its head announces {schema.size}")
        meta = schema.unpack(buf)
        ids = meta["env_ids"]
        if (ids < 0).any() or (ids >= self._n_sim).any() or len(np.unique(ids)) != n \
                or not 0 <= int(meta["truncated"]) <= n:
            raise bad(f"simulator ids {ids.astype(int).tolist()} of a group of {self._n_sim}")
        return meta

    def _base(self, req: _Request) -> int:
        """The learner-wide index of the request's group's first simulator."""
        return (req.actor * self._groups + req.group) * self._n_sim

    def _step(self, parts) -> Step:
        if not parts:  # stopping
            empty = np.zeros(0)
            return Step(empty.astype(np.int64), np.zeros((0, *self.obs_shape), self._dtype),
                        empty.astype(np.float32), empty.astype(bool), empty.astype(bool), None)
        ids, obs, reward, done, trunc, final, episodes = [], [], [], [], [], [], []
        for req, meta, rows, final_rows in parts:
            base = self._base(req)
            ids.append(base + req.env_ids)
            obs.append(rows)
            reward.append(meta["reward"].astype(np.float32))
            done.append(meta["done"].astype(bool))
            trunc.append(meta["truncated_mask"].astype(bool))
            if final_rows is not None:
                final.append(final_rows)
            episodes += [(int(base + e), float(r), int(n)) for e, r, n in
                         zip(meta["games_env"], meta["games_return"], meta["games_length"])]
        return Step(np.concatenate(ids), np.concatenate(obs), np.concatenate(reward),
                    np.concatenate(done), np.concatenate(trunc),
                    np.concatenate(final) if final else None, episodes)

    def _expire(self) -> None:
        """Leave out the actors silent for sync.timeout; with none left, the run cannot go on.
        Silent: nothing received from it, and nothing sent to it, for that long, and no step
        of it waiting here. An actor waits for its actions; a learner held up (its predictor
        blocked behind a slow trainer on a loaded node) must not count that wait against it."""
        now = time.monotonic()
        for actor in sorted(self._live):
            if now - self._stats[actor].last_heard > self._timeout and \
                    not self._comm.Iprobe(actor + 1, OBS_META):
                self._leave_out(actor, "sent nothing")
        if not self._live:
            raise DdrlError(f"central: every actor rank was silent for {self._timeout:g} s "
                            "(sync.timeout); nothing left to learn from")

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        """A `/ranks` row per live actor rank: its frames, seconds simulating and idle, and
        bytes to the learner (in) and back (out), per update over the last `updates`, and
        the mean seconds from a step sent to its actions; an `/inference` row of the batches
        over the same updates."""
        rows, n = [], max(updates, 1)
        for actor in sorted(self._live):
            st = self._stats[actor]
            t_sim, t_idle, t_round, rounds = st.clocks - st.marked
            rows.append({"rank": actor + 1, "frames": st.frames / n, "t_sim": t_sim / n,
                         "t_wait": t_idle / n, "t_round": t_round / max(rounds, 1),
                         "bytes_in": round(st.bytes_in / n), "bytes_out": round(st.bytes_out / n),
                         "contributed": 1})
            st.frames, st.bytes_in, st.bytes_out = 0.0, 0, 0
            st.marked[:] = st.clocks
        batches = [{"batches": self._batches, "observations": self._batched,
                    "t_gather": self._t_gather}]
        self._batches, self._batched, self._t_gather = 0, 0, 0.0
        return {"ranks": rows, "inference": batches}

    def close(self) -> None:
        """Tells every live actor to stop and takes in what each still had on the way (the
        count its goodbye names), so that no send is left pending; a left-out actor is ended
        with the job."""
        from mpi4py import MPI

        self.stopping.set()
        for actor in sorted(self._live):
            self._sends.append(self._comm.Isend(np.zeros(1, np.int64), actor + 1, STOP))
        byes = {a: np.zeros(1, np.int64) for a in self._live}
        pending = {a: self._comm.Irecv(byes[a], a + 1, STOP) for a in self._live}
        status, backoff = MPI.Status(), Backoff(spin=1e-3)
        deadline = time.monotonic() + self._timeout
        while pending and time.monotonic() < deadline:
            if self._comm.Iprobe(MPI.ANY_SOURCE, OBS_META, status):
                self._receive(status)
                continue
            for actor in [a for a, r in pending.items() if r.Test()]:
                if self._stats[actor].steps_received >= byes[actor][0]:
                    del pending[actor]
            backoff.sleep()
        # Silent to the end (frozen shortly before it, or its link cut): as lost as one left
        # out during the run, so the job ends once the learner has saved, not at the barrier.
        self.lost += [actor + 1 for actor in pending if actor + 1 not in self.lost]
        wait_all(self._sends, self._timeout)


class CentralSync(LocalSync):
    """The learner's sync: it is the only trainer, so a gradient is the update; at the end it
    holds the actor ranks until it has saved, or ends the job if one was left out."""

    name = "central"
    # The actor ranks go on simulating whatever the learner does.
    lockstep = False

    def __init__(self, world: World, own_comm: Any, pool: RemotePool, timeout: float):
        super().__init__(World(0, 1, world.local_rank, world.local_size, world.hosts, own_comm,
                               node_cpus=world.node_cpus))
        self._job = world
        self._pool = pool
        self._timeout = timeout

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        return array  # the actors hold no weights

    def close(self) -> None:
        if self._pool.lost:
            abort(self._job.comm, f"actor rank(s) {', '.join(map(str, self._pool.lost))} sent "
                                  "nothing for sync.timeout and were left out; the run is saved; "
                                  "ending the job")
        self._job.barrier(self._timeout, "at the end of the run")


def share_restarts(world: World, restarts: int) -> int:
    """The learner's restart count on every rank (the actors seed their simulators with it)."""
    return int(bcast(world.comm, np.array([restarts], np.int64))[0])
