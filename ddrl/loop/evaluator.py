"""Evaluation: greedy (or epsilon-greedy) actions, frozen weights, separate simulators, no reward
clipping or episodic life (the papers' score); in the background of a run, or for `ddrl eval`."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import numpy as np
import psutil

from ddrl.acting.policy import RecurrentState
from ddrl.config import Config
from ddrl.envs import SimPool, Step, make_pool
from ddrl.errors import DdrlError
from ddrl.output import say
from ddrl.seeding import derive_seed

MAX_EVAL_SIMS = 16


@dataclass
class EvalResult:
    mean: float
    std: float
    max: float
    episodes: int
    # How often the policy took each action over the games (what a score does not show:
    # a policy that holds one action).
    actions: np.ndarray | None = None
    # Stopped once the target was out of reach (`out_of_reach`): the mean is over the games
    # that ended first, the shortest, and is no score.
    cut: bool = False
    # Agent steps of the longest game (of one still going, when cut): what a wait was made of.
    longest: int = 0


@dataclass
class Played:
    """Whole games' (return, length in agent steps), and the actions taken in them."""
    games: list[tuple[float, int]]
    actions: np.ndarray
    # Stopped by `give_up`.
    cut: bool = False
    # Agent steps of the longest counted game still going when it stopped.
    going: int = 0


def eval_actions(cfg: Config, logits: np.ndarray, n_actions: int,
                 rng: np.random.Generator) -> np.ndarray:
    """The evaluated policy's actions from the network's first output (logits or Q-values):
    greedy, or epsilon-greedy with `eval.epsilon`."""
    actions = np.argmax(logits, axis=-1).astype(np.int32)
    if cfg.eval.epsilon > 0:
        # DQN's evaluation convention: a greedy policy that waits for a FIRE it never
        # presses (Breakout after a lost life) would otherwise play to the frame cap.
        explore = rng.random(len(actions)) < cfg.eval.epsilon
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
    return actions


class Pools:
    """An evaluator's simulators, kept from one evaluation to the next and restarted with
    each one's seed: making 10 of Pong's (ALE loads and resets each) took about a second of
    the 2 s a hopeless focused evaluation held the ranks. One pool per layout (simulators,
    batch, threads): a focused evaluation's, a confirmation's, a background one's."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, int, int], SimPool] = {}

    def get(self, cfg: Config, sims: int, seed: int, batch: int) -> SimPool:
        key = (sims, batch, cfg.env.env_threads)
        pool = self._made.get(key)
        if pool is None:
            pool = self._made[key] = make_pool(cfg, sims, seed, train=False, batch_size=batch)
        else:
            pool.restart(seed)
        return pool

    def close(self) -> None:
        for pool in self._made.values():
            pool.close()
        self._made.clear()


def play_games(cfg: Config, episodes: int, seed: int,
               scores: Callable[[Step], np.ndarray],
               stop: threading.Event | None = None,
               give_up: Callable[[list[float], float], bool] | None = None,
               cores: int = 0, sims: int = 0, halves: bool = True,
               pools: Pools | None = None) -> Played | None:
    """Play `episodes` whole games under the evaluation protocol, `scores(step)` rating each
    simulator's actions (logits or Q-values; `eval_actions` picks from them); each simulator
    plays its share so long games count too. None when `stop` is set before they are all
    played. `give_up(returns of the games ended, points lost so far in the counted games
    still going)` is asked as a game ends or a point is lost; when it says so, the games stop:
    those ended count, or where none has, those going as `whole_games`. `cores`: see
    `eval_simulators` (`sims` of them instead, if set); `halves`: see `pipelined_batch`;
    `pools`: simulators kept for the next evaluation (else made and closed here)."""
    sims = sims or eval_simulators(episodes, cores)
    quota = np.array([len(part) for part in np.array_split(np.arange(episodes), sims)])
    batch = 0
    if cores:
        cfg = replace(cfg, env=replace(cfg.env, env_threads=cores))
        batch = pipelined_batch(cfg, sims) if halves else 0
    pool = pools.get(cfg, sims, seed, batch) if pools is not None else \
        make_pool(cfg, sims, seed, train=False, batch_size=batch)
    rng = np.random.default_rng(seed)
    played = Played([], np.zeros(pool.n_actions, np.int64))
    # Each simulator's counted game so far: agent steps, points won and lost.
    steps, won, lost = np.zeros(len(quota), np.int64), np.zeros(len(quota)), np.zeros(len(quota))
    try:
        while quota.any():
            if stop is not None and stop.is_set():
                return None
            step = pool.recv()
            actions = eval_actions(cfg, scores(step), pool.n_actions, rng)
            pool.send(actions)
            counted = quota[step.env_ids] > 0
            ids, reward = step.env_ids[counted], step.reward[counted]
            steps[ids] += 1
            won[ids] += np.maximum(reward, 0)
            lost[ids] -= np.minimum(reward, 0)
            for env, ret, length in step.episodes:
                if quota[env] > 0:
                    quota[env] -= 1
                    played.games.append((ret, length))
                steps[env], won[env], lost[env] = 0, 0.0, 0.0
            if give_up is not None and quota.any() and (step.episodes or (reward < 0).any()) \
                    and give_up([ret for ret, _ in played.games], float(lost[quota > 0].sum())):
                if not played.games:
                    played.games.extend(whole_games(won, lost, steps, quota > 0,
                                                    cfg.eval.max_return))
                played.cut, played.going = True, int(steps[quota > 0].max())
                break
            # Only moves in games that count, not those of a simulator past its share.
            np.add.at(played.actions, actions[quota[step.env_ids] > 0], 1)
    finally:
        if pools is None:
            pool.close()
    return played


def whole_games(won: np.ndarray, lost: np.ndarray, steps: np.ndarray, going: np.ndarray,
                first_to: float) -> list[tuple[float, int]]:
    """(return, agent steps) of the games `going` that scored a point either way, each as if
    played to its end at the same rate, first to `first_to` points (eval.max_return, Pong's
    21): a game that lost every point scores -21, as it would have. A cut evaluation's games
    where none had ended: no score, but on the scale of one."""
    going = going & (np.maximum(won, lost) > 0)
    scale = first_to / np.maximum(won[going], lost[going])
    return list(zip(((won[going] - lost[going]) * scale).tolist(), steps[going].tolist()))


# While the ranks wait, an evaluation plays its games in as few rounds as hold at most this
# many simulators each, spread evenly: the run waits for its longest simulator. 10 Pong games
# on 4 simulators (3, 3, 2 and 2 games each) took 1.7x the time of 10 on 10 in two halves
# (`ddrl bench paused-eval`, 2 AMD EPYC Zen 4 cores, docs/performance.md).
PAUSED_SIMS = 20


def eval_simulators(episodes: int, cores: int = 0) -> int:
    """Simulators that play `episodes` games side by side: in the background, many (one
    batched inference for all); with `cores` of its own while the ranks wait, all of them in
    the fewest even rounds of at most PAUSED_SIMS, stepped by a thread a core."""
    if not cores:
        return min(episodes, MAX_EVAL_SIMS)
    rounds = -(-episodes // PAUSED_SIMS)
    return -(-episodes // rounds)


def pipelined_batch(cfg: Config, sims: int) -> int:
    """Simulators per inference batch while the ranks wait: half of them, one half stepped
    by the emulator's threads while the network (one thread) acts on the other, where one
    batch for all leaves a core idle at every inference (0: one batch). Only for greedy
    play, whose games do not depend on the order the halves come back in, and Atari's
    simulators (the classic ones step in one batch)."""
    return sims // 2 if cfg.is_atari and cfg.eval.epsilon == 0 and sims >= 2 else 0


def out_of_reach(cfg: Config, episodes: int, prior: EvalResult | None = None
                 ) -> Callable[[list[float], float], bool] | None:
    """Whether `episodes` games (after `prior`'s) can no longer bring the mean to eval.target
    even if every game left scores eval.max_return and every game going wins each point it
    has not lost yet: certain, no statistics. None where either is unset."""
    target, best = cfg.eval.target, cfg.eval.max_return
    if target is None or best is None:
        return None
    before, total = (0.0, episodes) if prior is None else (
        prior.mean * prior.episodes, prior.episodes + episodes)

    def hopeless(returns: list[float], lost: float = 0.0) -> bool:
        # A game going scores at most max_return less the points it lost: its rewards
        # above zero add up to at most max_return (Pong: 21 points won ends it).
        return before + sum(returns) + best * (episodes - len(returns)) - lost < target * total
    return hopeless


def evaluate(cfg: Config, learner, episodes: int, seed: int,
             stop: threading.Event | None = None,
             give_up: Callable[[list[float], float], bool] | None = None,
             cores: int = 0, sims: int = 0, halves: bool = True,
             pools: Pools | None = None) -> EvalResult | None:
    """The learner's policy over `episodes` whole games (fewer when `give_up` says so, see
    `play_games`, and for `cores`, `sims`, `halves`, `pools`); None when `stop` is set
    first."""
    sims = sims or eval_simulators(episodes, cores)
    state = RecurrentState(sims, learner.recurrent)
    played = play_games(cfg, episodes, seed, lambda step: state.step(
        learner.predict, step.obs, step.done, step.env_ids)[0], stop, give_up, cores, sims,
        halves, pools)
    if played is None:
        return None
    r = np.array([ret for ret, _ in played.games])
    longest = max([played.going, *(length for _, length in played.games)])
    return EvalResult(float(r.mean()), float(r.std()), float(r.max()), len(r), played.actions,
                      cut=played.cut, longest=longest)


@dataclass
class EvalDone:
    """A finished evaluation, attributed to the update, frames and wall time at which its
    weights were taken; what it took: `seconds` of wall time, `cpu_seconds` of the
    evaluator's."""
    update: int
    frames: int
    wall_time: float
    result: EvalResult
    weights: np.ndarray
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    # The ranks waited for it (Snapshot.paused).
    paused: bool = False


# The evaluator process's program (it imports this module: named, not imported here).
WORKER = "ddrl.loop.eval_worker"
# The most evaluator processes that play the weights a run still owes once it is over: each
# holds a TensorFlow and its simulators (about 0.6 GB for Atari).
MAX_SIBLINGS = 7
# A run gives up after this many evaluator processes died in a row (killed for memory,
# crashed); one that died is replaced at the next evaluation.
WORKER_DEATHS = 3


@dataclass
class Snapshot:
    """Weights to evaluate, and the update, frames and wall time at which they were taken.
    A confirmation (`prior`: what these weights scored already) plays `episodes` more games
    of its own seeds; its result is over all the games. `paused`: the ranks wait while it
    plays, which it does on all the job's cores on this machine."""
    weights: np.ndarray
    update: int
    frames: int
    wall_time: float
    prior: EvalResult | None = None
    episodes: int = 0
    paused: bool = False


def games_seed(cfg: Config, snap: Snapshot) -> int:
    """The seed of the games `snap`'s weights play: an evaluation's and its confirmation's
    are each the same wherever they play (the background evaluator, rank 0 at the run's end)."""
    stream = "confirm" if snap.prior is not None else "eval"
    return derive_seed(cfg.run.seed, 0, f"{stream}/{snap.update}")


def evaluate_here(cfg: Config, learner, snap: Snapshot, seed: int,
                  stop: threading.Event | None = None) -> EvalDone | None:
    """`snap`'s weights, which are the learner's, over `cfg.eval.episodes` games on this
    process's threads (a confirmation: its games, stopped once out of reach as the
    evaluator's are, and the result over all the weights' games): the process's CPU time is
    the evaluation's. None when `stop` is set first."""
    wall, cpu = time.monotonic(), time.process_time()
    if snap.prior is None:
        res = evaluate(cfg, learner, cfg.eval.episodes, seed, stop)
    else:
        res = evaluate(cfg, learner, snap.episodes, seed, stop,
                       out_of_reach(cfg, snap.episodes, snap.prior))
        res = None if res is None else pooled(snap.prior, res)
    if res is None:
        return None
    return EvalDone(snap.update, snap.frames, snap.wall_time, res, snap.weights,
                    time.monotonic() - wall, time.process_time() - cpu)


def pooled(a: EvalResult, b: EvalResult) -> EvalResult:
    """One result over the games of both."""
    n = a.episodes + b.episodes
    mean = (a.mean * a.episodes + b.mean * b.episodes) / n
    square = ((a.std ** 2 + a.mean ** 2) * a.episodes + (b.std ** 2 + b.mean ** 2) * b.episodes) / n
    actions = None if a.actions is None or b.actions is None else a.actions + b.actions
    return EvalResult(mean, float(np.sqrt(max(square - mean ** 2, 0.0))), max(a.max, b.max), n,
                      actions, a.cut or b.cut, max(a.longest, b.longest))


@dataclass
class _Pending:
    snapshot: Snapshot
    started: float
    # The worker's CPU seconds when last read, when they last grew, and when last read.
    cpu: float = -1.0
    progressed: float = 0.0
    checked: float = 0.0


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time, all its threads' (-1 once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return -1.0
    return times.user + times.system


class BackgroundEvaluator:
    """Rank 0 evaluates snapshots of the weights in a process of its own (`eval_worker`,
    started at the first evaluation), so the other ranks never wait for it in the all-reduce
    (the paper used a separate node). The process runs at `eval.nice`, and its CPU time stays
    within `eval.cpu_share` of `cores`, one rank's: in a synchronous job, what it takes from
    any rank holds back all of them, so that share is what evaluating may cost the run's
    throughput. It may run on `cpus`, every core of the job's ranks on this machine: with each
    rank bound to its own, a worker held to rank 0's would wait for rank 0's idle moments alone,
    while at its low priority it can take any rank's."""

    def __init__(self, cfg: Config, spec: tuple, cores: int, deterministic: bool,
                 cpus: frozenset[int] = frozenset()):
        self._cfg, self._spec, self._cores, self._cpus = cfg, spec, cores, cpus
        self._deterministic = deterministic
        self._since = time.monotonic()
        self._cpu = 0.0  # the evaluations' CPU time so far, all workers'
        self._last_cpu = 0.0  # what the last evaluation took: the next will take about as much
        self._deaths = 0
        self._proc: subprocess.Popen | None = None
        self._to: Connection | None = None
        self._sending: threading.Thread | None = None
        self._from: Connection | None = None
        self._pending: _Pending | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None

    @property
    def playing(self) -> Snapshot | None:
        return self._pending.snapshot if self._pending is not None else None

    def within_budget(self) -> bool:
        """Whether an evaluation that takes as much CPU time as the last one fits the share.
        The first starts when due, whatever it will take: nothing is known of its cost."""
        share = self._cfg.eval.cpu_share
        allowed = share * self._cores * (time.monotonic() - self._since)
        return share >= 1.0 or self._cpu + self._last_cpu <= allowed

    def siblings(self, most: int) -> list[BackgroundEvaluator]:
        """Up to `most` more evaluators like this one, one for each other core it may run on
        (at most MAX_SIBLINGS): once the ranks have stopped, owed evaluations play side by
        side on the cores they leave."""
        spare = min(most, MAX_SIBLINGS, max(len(self._cpus), self._cores) - 1)
        return [BackgroundEvaluator(self._cfg, self._spec, self._cores, self._deterministic,
                                    self._cpus) for _ in range(spare)]

    def start(self, snapshot: Snapshot) -> None:
        if self._proc is None:
            self._spawn()
        seed = games_seed(self._cfg, snapshot)
        now = time.monotonic()
        self._pending = _Pending(snapshot, now, progressed=now)
        self._send((snapshot.weights, snapshot.update,
                    snapshot.episodes or self._cfg.eval.episodes, seed, snapshot.prior,
                    max(len(self._cpus), self._cores) if snapshot.paused else 0))

    def _send(self, message: tuple) -> None:
        """On a thread of its own: weights larger than the pipe's buffer would hold the
        training thread for as long as a frozen worker does not read (poll's stall check
        ends that)."""
        def send(conn: Connection) -> None:
            try:
                conn.send(message)
            except OSError:
                pass  # a worker that died: poll tells
        if self._sending is not None:
            self._sending.join()  # a message at a time (the previous one was answered)
        self._sending = threading.Thread(target=send, args=(self._to,), daemon=True,
                                         name="ddrl-eval-send")
        self._sending.start()

    def _spawn(self) -> None:
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        # Only its own ends reach the worker, so it sees end-of-file when this process ends.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", WORKER, str(to_read), str(from_write),
             ",".join(map(str, sorted(self._cpus)))],
            pass_fds=(to_read, from_write), stdin=subprocess.DEVNULL)
        os.close(to_read)
        os.close(from_write)
        self._to = Connection(to_write, readable=False)
        self._from = Connection(from_read, writable=False)
        self._send((self._cfg, self._spec, self._cfg.eval.nice, self._deterministic))

    def poll(self, wait: bool = False, stop: threading.Event | None = None) -> EvalDone | None:
        """The finished evaluation, once; `wait` for one in progress, unless `stop` is set
        first, which abandons it."""
        if self._pending is None:
            return None
        frozen = False
        while not self._from.poll(0.1 if wait else 0):
            if self._stalled():
                # Its pipe closes as it dies: the receive below tells.
                frozen = True
                self._proc.kill()
                break
            if not wait:
                return None
            if stop is not None and stop.is_set():
                self.cancel()
                return None
        pending, self._pending = self._pending, None
        try:
            message = self._from.recv()
        except (EOFError, OSError):
            self._worker_died(pending.snapshot.update, frozen)
            return None
        if message[0] == "error":
            last = message[2].strip().splitlines()[-1]
            raise DdrlError(f"the evaluation of update {message[1]} failed: {last}")
        _, _, result, cpu = message
        self._deaths = 0
        self._cpu += cpu
        self._last_cpu = cpu
        snap = pending.snapshot
        if snap.prior is not None:
            result = pooled(snap.prior, result)
        return EvalDone(snap.update, snap.frames, snap.wall_time, result, snap.weights,
                        time.monotonic() - pending.started, cpu, snap.paused)

    def _stalled(self) -> bool:
        """The worker used no CPU time for sync.timeout while it had an evaluation: frozen
        (SIGSTOP, a hung filesystem), not slow: a nice-19 worker on busy cores still gets
        some. Read once a second at most."""
        pending, now = self._pending, time.monotonic()
        if now - pending.checked < 1.0:
            return False
        pending.checked = now
        cpu = _cpu_seconds(self._proc.pid)
        if cpu != pending.cpu:
            pending.cpu, pending.progressed = cpu, now
        return now - pending.progressed > self._cfg.sync.timeout

    def _worker_died(self, update: int, frozen: bool = False) -> None:
        code = self._proc.wait()
        self._end_worker()
        self._deaths += 1
        how = f"no CPU time for sync.timeout ({self._cfg.sync.timeout:g} s), killed" if frozen \
            else f"signal {-code}" if code < 0 else f"exit status {code}"
        if self._deaths >= WORKER_DEATHS:
            raise DdrlError(f"the evaluator process died {WORKER_DEATHS} times in a row, the "
                            f"last time with {how} in the evaluation of update {update}")
        say(f"[ddrl] warning: the evaluator process {'froze' if frozen else 'died'} ({how}); "
            f"the evaluation of update {update} is lost, a new process plays the next", err=True)

    def _end_worker(self) -> None:
        """Its pipes closed; the CPU time of an evaluation it did not finish is not counted."""
        if self._sending is not None:
            # Ended by the worker's end (a broken pipe): only then may its descriptor close.
            self._sending.join()
            self._sending = None
        for conn in (self._to, self._from):
            conn.close()
        self._proc = self._to = self._from = None

    def cancel(self) -> None:
        """Abandon a game in progress, and end the worker (idle or not)."""
        self._pending = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._end_worker()
