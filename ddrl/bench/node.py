"""`ddrl bench node JOB.toml [--seconds S] [--set k=v ...] [--ranks N]`: one node's throughput
against two ceilings measured in the same run, one rank's on one rank's share of the cores and
threads, times the ranks:

- the emulator alone: the node's own simulator pools stepped with random actions;
- the network alone: inference and training on synthetic batches of the node's sizes.

The node itself is measured as what it is in production, a real `ddrl train` of the job
(under `mpirun -n N` with --ranks), read back from its HDF5 log after a warm-up.
"""
from __future__ import annotations

import argparse
import math
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ddrl.cpus import each_thread
from ddrl.errors import DdrlError

if TYPE_CHECKING:
    from ddrl.algos.batch import Batch

PEAK_TAG = "[ddrl-bench] peak_rss_bytes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="measured seconds of each part: emulator, network, node (default 20)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable)")
    p.add_argument("--ranks", type=int, default=1,
                   help="run the node as N MPI ranks on this machine (mpirun -n N)")


@dataclass
class NodeFigures:
    """Whole-job rates per second, and each activity's seconds as a share of an update."""
    agent_steps: float
    data_points: float
    frames: float
    updates: int
    shares: dict[str, float]
    peak_rss: list[int] = field(default_factory=list)
    # The evaluations that played in the measured window (`/eval` rows), when they were on.
    evals: np.ndarray | None = None


def warmup_seconds(seconds: float) -> float:
    """Tracing of the compiled steps and the first FIFO fill stay out of the figures."""
    return max(2.0, 0.25 * seconds)


def measure_training(job: str, overrides: list[str], seconds: float, frames_per_step: int,
                     ranks: int = 1, evaluate: bool = False,
                     start_from: Path | None = None) -> NodeFigures:
    """Runs `ddrl train` for warm-up + `seconds` and reads its steady-state figures; with
    `evaluate`, the job's own evaluations on (no target); `start_from`: a copy of that run
    directory, resumed from its latest checkpoint (the trained agent's longer games)."""
    import shutil

    from ddrl.distributed.launch import mpirun_command
    from ddrl.rundir import checkpoint

    warmup = warmup_seconds(seconds)
    with tempfile.TemporaryDirectory(prefix="ddrl-bench-") as tmp:
        out, resume, begin = Path(tmp) / "run", [], 0.0
        if start_from is not None:
            latest = checkpoint.latest(start_from / "checkpoints")
            if latest is None:
                raise DdrlError(f"no checkpoint in {start_from / 'checkpoints'}")
            begin = checkpoint.load(latest).wall_time
            shutil.copytree(start_from, out, ignore=shutil.ignore_patterns(".lock", "ckpt-*"))
            shutil.copy2(latest, out / "checkpoints" / latest.name)
            resume = ["--resume"]
        # run.max_minutes counts the run's time across restarts.
        sets = [*overrides, f"run.max_minutes={(begin + warmup + seconds) / 60}",
                "run.max_frames=1000000000000", "eval.target=none", "run.log_every=1",
                "run.checkpoint_minutes=1e6", "run.progress_seconds=1e6",
                *([] if evaluate else ["eval.episodes=0"])]
        cmd = [sys.executable, "-m", "ddrl.bench.node", job, "--out", str(out), *resume,
               *(arg for s in sets for arg in ("--set", s))]
        if ranks > 1:
            cmd = [*mpirun_command(ranks), *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise DdrlError(f"the measured training exited with {proc.returncode}: {tail}")
        peaks = [int(line.split()[-1]) for line in proc.stdout.splitlines()
                 if line.startswith(PEAK_TAG)]
        rows, evals = _tables(out / "log.h5", ("train", "eval"))
    steady = rows[rows["wall_time"] >= begin + warmup]
    if len(steady) < 2:
        raise DdrlError(f"fewer than 2 updates after {warmup:.0f} s of warm-up: raise --seconds")
    first, last = steady[0], steady[-1]
    span = last["wall_time"] - first["wall_time"]
    counted = steady[1:]
    period = span / (last["update"] - first["update"])
    means = {k: float(counted[f"t_{k}"].mean()) for k in ("sim", "predict", "train", "sync")}
    shares = {"simulate": means["sim"] / period, "predict": means["predict"] / period,
              "train": means["train"] / period, "sync": means["sync"] / period,
              "wait": max(0.0, 1.0 - (means["train"] + means["sync"]) / period)}
    frames = (last["frames"] - first["frames"]) / span
    # Those that played in the window; the final evaluation after it is rank 0's own, not the
    # evaluator's (no CPU time on its row).
    evals = evals[(evals["wall_time"] + evals["seconds"] >= first["wall_time"])
                  & (evals["cpu_seconds"] > 0)]
    return NodeFigures(frames / frames_per_step, counted["effective_batch"].sum() / span, frames,
                       int(last["update"] - first["update"]), shares, peaks, evals)


def _tables(path: Path, names: tuple[str, ...]) -> list[np.ndarray]:
    import h5py

    with h5py.File(path, "r") as f:
        return [f[name][:] for name in names]


def emulator_rate(pools: list, seconds: float) -> float:
    """Agent steps/s of the pools with random actions, serviced in turn like the node does."""
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for pool in pools:
            step = pool.recv()
            pool.send(rng.integers(0, pool.n_actions, len(step.env_ids), dtype=np.int32))
            steps += len(step.env_ids)
    return steps / (time.perf_counter() - start)


def synthetic_obs(rng: np.random.Generator, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                  n: int) -> np.ndarray:
    """`n` random observations of the environment's shape and type (0-255 for frames)."""
    if np.issubdtype(obs_dtype, np.integer):
        return rng.integers(0, 256, (n, *obs_shape), dtype=obs_dtype)
    return rng.standard_normal((n, *obs_shape)).astype(obs_dtype)


def synthetic_batch(rng: np.random.Generator, learner, obs_shape: tuple[int, ...],
                    obs_dtype: np.dtype, n: int) -> Batch:
    """A training batch of `n` random observations, actions and targets in the shapes the
    learner's algorithm takes: the network's cost does not depend on their values."""
    from ddrl.algos.batch import Batch

    algo = learner.algo
    return Batch(synthetic_obs(rng, obs_shape, obs_dtype, n),
                 rng.integers(0, learner.n_actions, n, dtype=np.int32), np.zeros(n, np.int64),
                 {f: rng.uniform(-1, 1, (n, *algo.target_shapes.get(f, ()))).astype(np.float32)
                  for f in algo.fields})


def network_rate(learner, obs_shape: tuple[int, ...], obs_dtype: np.dtype, infer_batch: int,
                 train_batch: int, seconds: float, actor_threads: int) -> float:
    """Data points/s of the network alone on synthetic observations: per training batch, one
    gradient step with its Adam update plus the inference calls that chose its actions.

    With `actor_threads`, inference runs on that many threads feeding the training loop
    through a bounded queue, as ba3c's predictors feed its FIFO; without, inference and
    training take turns on one thread, as in a2c."""
    from ddrl.acting.policy import sample_actions

    rng = np.random.default_rng(0)
    infer_obs = synthetic_obs(rng, obs_shape, obs_dtype, infer_batch)
    batch = synthetic_batch(rng, learner, obs_shape, obs_dtype, train_batch)

    def act(gen: np.random.Generator) -> None:
        sample_actions(learner.predict(infer_obs)[0], gen)

    def train() -> None:
        learner.apply(learner.gradients(batch)[0])

    act(rng)  # traces the compiled steps
    train()
    stop = threading.Event()
    ready: queue.Queue[int] = queue.Queue(maxsize=max(1, 4 * train_batch // infer_batch))

    def actor(seed: int) -> None:
        gen = np.random.default_rng(seed)
        while not stop.is_set():
            act(gen)
            while not stop.is_set():
                try:
                    ready.put(infer_batch, timeout=0.1)
                    break
                except queue.Full:
                    continue

    threads = [threading.Thread(target=actor, args=(i,), daemon=True) for i in range(actor_threads)]
    left = 0

    def gather() -> None:
        """Returns once the inference calls for one training batch are done."""
        nonlocal left
        if not threads:
            for _ in range(math.ceil(train_batch / infer_batch)):
                act(rng)
            return
        while left < train_batch:
            left += ready.get(timeout=60)
        left -= train_batch

    for t in threads:
        t.start()
    batches, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            gather()
            train()
            batches += 1
        return batches * train_batch / (time.perf_counter() - start)
    finally:
        stop.set()
        for t in threads:
            t.join()


def matmul_rate(dtype: str, seconds: float, n: int = 1024) -> float:
    """FLOP/s of an n x n matmul in `dtype` on this rank's threads: oneDNN's GEMM, the most
    of the cores' bound a network's kernels can hope for (the clock under load included)."""
    import tensorflow as tf

    a = tf.cast(np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32), dtype)
    step = tf.function(lambda x: tf.reduce_sum(tf.cast(tf.matmul(x, x), tf.float32)),
                       autograph=False).get_concrete_function(tf.TensorSpec((n, n), dtype))
    step(a).numpy()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(a).numpy()
        calls += 1
    return 2 * n ** 3 * calls / (time.perf_counter() - start)


def forward_passes(learner, train_batch: int) -> tuple[int, float, float]:
    """(FLOP of one forward pass, forward passes to act on an agent step, training passes of
    its data point): one pass acts, one more where the learner re-values the rollout
    (off-policy targets); a training pass (forward and backward) costs 3 forward passes."""
    from ddrl.algos.batch import Batch
    from ddrl.models import forward_flops

    algo = learner.algo
    index = np.zeros(train_batch)
    passes = sum(len(m) for m in algo.minibatches(Batch(index, index, index),
                                                  np.random.default_rng(0))) / train_batch
    return forward_flops(learner.model), 1 + bool(getattr(algo, "off_policy", False)), passes


def batch_sizes(cfg) -> tuple[int, int]:
    """(inference batch, training batch) of an actor-critic node, for the network alone."""
    if cfg.acting.mode == "a2c":
        groups = min(cfg.acting.groups, cfg.acting.n_sim)
        return -(-cfg.acting.n_sim // groups), cfg.acting.t_max * cfg.acting.n_sim
    from ddrl.acting.ba3c import inference_batch

    return inference_batch(cfg, -(-cfg.acting.n_sim // cfg.acting.predictors)), cfg.acting.batch_size


def ceilings(cfg, learner, node_cls, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
             seconds: float) -> tuple[float, float, int, float, set[int]]:
    """(emulator agent steps/s, network data points/s, frames per agent step, matmul FLOP/s)
    of one rank, and the cores its threads had while the simulators ran."""
    from ddrl.models import compute_precision

    node = node_cls(cfg, learner, rank=0, restart=0)
    try:
        frames_per_step = node.pools[0].frames_per_step
        emulator = emulator_rate(node.pools, seconds)
        cores = threads_cores()
    finally:
        node.close()
    actor_threads = cfg.acting.predictors if cfg.acting.mode == "ba3c" else 0
    network = network_rate(learner, obs_shape, obs_dtype, *batch_sizes(cfg), seconds,
                           actor_threads)
    return emulator, network, frames_per_step, matmul_rate(compute_precision(cfg.model),
                                                           min(3.0, seconds / 4)), cores


def threads_cores() -> set[int]:
    """The cores this process's threads may run on, all of them (the simulators' included)."""
    return set().union(*each_thread(os.sched_getaffinity))


def pin_threads(cores: set[int]) -> None:
    """Every thread of this process on `cores` (numpy's and TensorFlow's, started before, too);
    new ones inherit it."""
    each_thread(lambda tid: os.sched_setaffinity(tid, cores))


def run(args: argparse.Namespace) -> int:
    from ddrl.cpus import configure_tensorflow, cores_per_rank
    from ddrl.placement import load_job

    if args.seconds <= 0 or args.ranks < 1:
        raise DdrlError("--seconds must be > 0 and --ranks >= 1")
    cfg = load_job(args.job, args.set)
    if cfg.acting.mode == "dqn":
        raise DdrlError("a DQN job: its speed test is `ddrl bench dqn JOB`")
    if cfg.algo.recurrent:
        raise DdrlError("a recurrent actor-critic (algo.recurrent): the network-alone ceiling "
                        "is measured for feed-forward nets; `ddrl train` logs its frames/s")
    threads = cores_per_rank(cfg.acting.threads, args.ranks)
    # The ceilings are one rank's, so they run on one rank's share of the cores: every thread,
    # those started later (TensorFlow's pools, the simulators') inheriting the mask. Over all
    # the cores one rank's two simulator groups ran 1.6x their rate on the one core a bound
    # rank has (Zen 3), and the x ranks below overstated the emulator by as much.
    everywhere = os.sched_getaffinity(0)
    one_rank = set(sorted(everywhere)[:threads])
    pin_threads(one_rank)
    configure_tensorflow(threads, deterministic=cfg.acting.mode == "a2c")

    from ddrl.acting import actors_class
    from ddrl.envs import env_spec
    from ddrl.learner import Learner
    from ddrl.models import compute_precision, forward_flops

    obs_shape, obs_dtype, n_actions = env_spec(cfg)
    learner = Learner(cfg, obs_shape, obs_dtype, n_actions)
    node_cls = actors_class(cfg)
    infer_batch, train_batch = batch_sizes(cfg)
    print(f"ddrl bench node {args.job}: {cfg.env.id}, {cfg.acting.mode}, {cfg.acting.n_sim} simulators, "
          f"net {cfg.model.arch} ({learner.num_params:,} params, "
          f"{forward_flops(learner.model) / 1e6:.2f} MFLOP/obs), {compute_precision(cfg.model)}, "
          f"batches {infer_batch} (inference) / {train_batch} (training), "
          f"{args.ranks} rank(s) x {threads} thread(s), {args.seconds:g} s per part", flush=True)

    # Ceilings are measured half before and half after the node, so load that drifts during
    # the run (shared machines) weighs on both sides of each ratio alike.
    halves = [ceilings(cfg, learner, node_cls, obs_shape, obs_dtype, args.seconds / 2)]
    # mpirun inherits this thread's mask: the node's ranks get all the cores.
    os.sched_setaffinity(0, everywhere)
    fig = measure_training(args.job, args.set, args.seconds, halves[0][2], args.ranks)
    pin_threads(one_rank)
    halves.append(ceilings(cfg, learner, node_cls, obs_shape, obs_dtype, args.seconds / 2))
    emulator, network, _, matmul = (sum(h[i] for h in halves) / 2 * args.ranks
                                    for i in range(4))
    cores = sorted(halves[0][4] | halves[1][4])
    print(f"one rank's ceilings on {len(cores)} of {len(everywhere)} cores ({cores}), "
          f"times {args.ranks} rank(s)")
    print(format_report(fig, emulator, network, halves[0][2], args.ranks))
    print(format_bound(fig, network, forward_passes(learner, train_batch), halves[0][2], matmul,
                       compute_precision(cfg.model), threads * args.ranks))
    return 0


def format_bound(fig: NodeFigures, network: float, passes: tuple[int, float, float],
                 frames_per_step: int, matmul: float, precision: str, cores: int) -> str:
    """The node's and the network's arithmetic rates against the cores' bound: the nominal one
    (FLOP per cycle at cpuinfo's clock) and a large matmul's, measured on the same threads."""
    from ddrl.cpus import cpuinfo, peak_flops_per_cycle

    forward, acting, training = passes
    step_flops = forward * (acting + 3 * training)
    lines = [f"arithmetic: {step_flops / frames_per_step / 1e6:.2f} MFLOP per frame "
             f"({forward / 1e6:.2f} MFLOP a forward pass x ({acting} to act + 3 x {training:g} "
             f"training passes) / {frames_per_step} frames an agent step)",
             f"{precision} matmul (1,024^2) on these threads: {matmul / 1e9:,.1f} GFLOP/s "
             f"({matmul / cores / 1e9:,.1f} a core)"]
    peak, mhz = peak_flops_per_cycle(precision), float(cpuinfo().get("cpu MHz", "0") or 0)
    nominal = peak[0] * mhz * 1e6 * cores if peak and mhz else None
    if nominal:
        lines.append(f"{precision} nominal bound: {peak[0]} FLOP/cycle ({peak[1]}) x "
                     f"{mhz:,.0f} MHz (cpuinfo) x {cores} cores = {nominal / 1e9:,.1f} GFLOP/s")
    # The network alone trains each data point once, beside the one inference that chose it.
    for name, rate in (("node", fig.agent_steps * step_flops),
                       ("network alone", network * forward * (1 + 3))):
        against = f"{rate / matmul:.2f} of the matmul's" + (
            f", {rate / nominal:.2f} of the nominal bound" if nominal else "")
        lines.append(f"{name:14s}{rate / 1e9:8,.1f} GFLOP/s: {against}")
    return "\n".join(lines)


def format_report(fig: NodeFigures, emulator: float, network: float, frames_per_step: int,
                  ranks: int) -> str:
    scaled = f" (one rank's x {ranks})" if ranks > 1 else ""
    lines = [
        f"{'':32s}{'agent steps/s':>15s}{'data points/s':>15s}{'frames/s':>12s}",
        f"{'emulator alone' + scaled:32s}{emulator:15,.0f}{'-':>15s}{emulator * frames_per_step:12,.0f}",
        f"{'network alone' + scaled:32s}{'-':>15s}{network:15,.0f}{'-':>12s}",
        f"{'node':32s}{fig.agent_steps:15,.0f}{fig.data_points:15,.0f}{fig.frames:12,.0f}",
        f"node / emulator alone: {fig.agent_steps / emulator:.2f}   "
        f"node / network alone: {fig.data_points / network:.2f}   "
        f"node / both in series: {fig.data_points * (1 / emulator + 1 / network):.2f}   "
        f"({fig.updates} updates measured)",
        "  (in series: the rate if the same cores emulated, then ran the network, with no "
        "overlap; above 1, the node overlaps them)",
        "time shares of an update: actors: simulate {simulate:.0%}  predict {predict:.0%}   "
        "trainer: train {train:.0%}  sync {sync:.0%}  wait {wait:.0%}".format(**fig.shares),
        "  (wait: the rest of the trainer's update, mostly waiting for its batch; a2c acts on the"
        " trainer's thread, so there its wait holds simulate and predict)",
    ]
    if ranks > 1:
        lines.append(f"gradient sync: {fig.shares['sync']:.1%} of each update")
    if fig.peak_rss:
        per_rank = ", ".join(f"{b / 2**30:.2f}" for b in fig.peak_rss)
        lines.append(f"peak resident memory per rank: {max(fig.peak_rss) / 2**30:.2f} GiB"
                     + (f" (ranks: {per_rank} GiB)" if len(fig.peak_rss) > 1 else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    # One rank of the measured training, then its peak resident memory: getrusage has the
    # kernel's high-water mark, which psutil does not expose on Linux.
    from ddrl.cli import main

    code = main(["train", *sys.argv[1:]])
    print(PEAK_TAG, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)
    sys.exit(code)
