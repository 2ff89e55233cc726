"""`ddrl train JOB.toml [--set k=v ...] [--out DIR] [--resume]`: set up one rank and run it."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import traceback
from pathlib import Path

from ddrl.commands.args import job_file
from ddrl.config import Config
from ddrl.errors import DdrlError, EveryRankError, storage_errors
from ddrl.output import say
from ddrl.placement import load_job
from ddrl.rundir import checkpoint, default_run_dir, hold, prepare, remove_leftovers, wandb_writer
from ddrl.rundir.tensorboard import EventWriter, start_timestamp
from ddrl.signals import StopSignals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_file, help="TOML job file, or a recipe's name (`ddrl recipes`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set optim.lr=5e-4 (repeatable)")
    p.add_argument("--out", help="run directory (default: runs/<job>-<slurm job id or time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint")


def run(args: argparse.Namespace) -> int:
    # From here to the process's end a stop signal (Slurm's time-limit warning, scancel) is
    # a request: one during start-up stops the run at its first update, with a checkpoint.
    with StopSignals() as signals:
        return _run(args, signals)


def _run(args: argparse.Namespace, signals: StopSignals) -> int:
    from ddrl.distributed.waiting import Deadline
    from ddrl.distributed.world import discover, launched_by_mpi_or_slurm, launcher_rank
    from ddrl.loop.faults import BEFORE_MPI, freeze_at_startup
    from ddrl.placement import check_world

    rank = launcher_rank()
    quiet = rank != 0  # every rank reads the job: one copy of each note is enough
    try:
        cfg = load_job(args.job, args.set, note=(lambda line: None) if quiet else None)
        freeze_at_startup(cfg, rank, BEFORE_MPI)
        seconds, limit = _startup_limit(cfg)
        # A rank frozen before MPI (a hung import from a shared filesystem) holds the others
        # in MPI_Init or the world's first collectives, spinning a core, for ever. Without a
        # launcher there is no MPI and nobody to wait for.
        deadline = Deadline(seconds, f"rank {rank} waited {seconds:g} s ({limit}) for the job's "
                            "ranks to start MPI and meet: one is frozen or lost before it; ending "
                            "the job", speaker=rank == 0) if launched_by_mpi_or_slurm() \
            else contextlib.nullcontext()
        with deadline:
            world = discover(need_mpi=False)
            startup = _startup_watchdog(cfg, world)  # its roll call's communicator is a collective
        check_world(cfg, world.size)
        wandb_writer.check_installed(cfg)
    except DdrlError as exc:
        raise EveryRankError(str(exc)) from None
    run_dir = Path(args.out) if args.out else default_run_dir(args.job)
    if world.comm is not None:
        with startup:
            run_dir = Path(world.comm.bcast(str(run_dir), root=0))
    held = None  # rank 0's lock on the run directory, for the life of this process
    try:
        held = hold(run_dir) if world.is_root else None
        if held is not None:
            remove_leftovers(run_dir)
        resumed, problem = prepare(run_dir, args.resume, world.is_root, cfg), None
    except DdrlError as exc:
        resumed, problem = None, (str(exc), exc.exit_code)
    if world.comm is not None:
        # Every rank checked the run directory (shared, or its node's own); none proceeds
        # unless all agreed, and the first rank's problem is reported once for the job.
        with startup:
            problem = next((p for p in world.comm.allgather(problem) if p), None)
    if problem:
        if held is not None:
            held.close()  # the lock file too: nothing of this refused start stays behind
        error = EveryRankError(problem[0])
        error.exit_code = problem[1]  # "in use" stays retryable
        raise error
    if world.comm is not None and resumed is not None:
        # Rank 0's checkpoint sets the counters (the lr schedule, the frame budget, the replay
        # files to take up): another rank may have read an older one through a stale NFS cache.
        with startup:
            counters = world.comm.bcast((resumed.update, resumed.frames, resumed.wall_time,
                                         resumed.restarts), root=0)
        resumed = dataclasses.replace(resumed, update=counters[0], frames=counters[1],
                                      wall_time=counters[2], restarts=counters[3])
    try:
        with storage_errors():
            return _train(cfg, world, run_dir, resumed, signals, startup)
    except BaseException as exc:
        if world.size > 1 and not isinstance(exc, SystemExit):
            # The other ranks would wait in the next collective (and MPI_Finalize) forever.
            message = str(exc) if isinstance(exc, DdrlError) else traceback.format_exc()
            say(f"ddrl: error: rank {world.rank}: {message}", err=True)
            world.comm.Abort(2 if isinstance(exc, DdrlError) else 1)
        raise
    finally:
        if held is not None:
            held.close()


def _startup_limit(cfg: Config) -> tuple[float, str]:
    """How long a start-up step may wait for the other ranks, and the keys that say so. Ranks
    that reach one seconds apart (TensorFlow's import on a busy node) are no fault: at least
    sync.startup_timeout."""
    floor = cfg.sync.startup_timeout
    return (max(cfg.sync.timeout, floor),
            f"sync.timeout, at least sync.startup_timeout = {floor:g} s at start-up")


def _startup_watchdog(cfg: Config, world) -> contextlib.AbstractContextManager:
    """A deadline for the start-up's collectives (run directory, counters, initial weights): a
    rank frozen or lost before one would hold the others in a blocking MPI call, spinning a
    core, forever."""
    if world.comm is None or world.size == 1:
        return contextlib.nullcontext()
    from ddrl.distributed.waiting import collective_watchdog

    seconds, limit = _startup_limit(cfg)
    return collective_watchdog(world, seconds, lambda: "a start-up collective", limit=limit)


def _train(cfg: Config, world, run_dir: Path, ckpt: checkpoint.Checkpoint | None,
           signals: StopSignals, startup: contextlib.AbstractContextManager) -> int:
    from ddrl.cpus import start_tensorflow
    from ddrl.envs import env_spec
    from ddrl.loop.faults import BEFORE_PLACEMENT, BEFORE_WEIGHTS, freeze_at_startup
    from ddrl.placement import placement_of

    placement = placement_of(cfg)(cfg, world)
    freeze_at_startup(cfg, world.rank, BEFORE_PLACEMENT)
    with startup:  # central mode's split and restart broadcast are collectives too
        restarts = placement.start(ckpt.restarts + 1 if ckpt is not None else 0)
    if not placement.trains:
        code = placement.serve(restarts)
        signals.job_stopping = True  # it leaves when the trainers end the job, not on signals
        return code
    cores = start_tensorflow(cfg, world.local_size)
    from ddrl.learner import Learner
    from ddrl.loop.trainer import Trainer

    spec = env_spec(cfg)
    learner = Learner(cfg, *spec, workers=placement.trainer_ranks(cfg, world.size))
    sync = placement.sync(learner, spec)
    counters = _restore(cfg, world, run_dir, ckpt, restarts, learner)
    freeze_at_startup(cfg, world.rank, BEFORE_WEIGHTS)
    with startup:
        learner.share_root_state(sync.broadcast)
    world = sync.world  # the ranks that run the loop: in ps mode the workers, in central the learner
    log, evaluator = (_root_outputs(cfg, world, run_dir, ckpt, counters, learner, sync, spec, cores)
                      if world.is_root else (None, None))
    actors = placement.actors(learner, counters.restarts)
    actors.check_memory(world.local_size)
    actors.update = counters.update
    if ckpt is not None:
        actors.restore_state(run_dir / "checkpoints", counters.update)
    trainer = Trainer(cfg, world, learner, actors, sync, run_dir, counters, log, evaluator)
    try:
        return trainer.run(signals)
    finally:
        sync.close()


def _restore(cfg: Config, world, run_dir: Path, ckpt: checkpoint.Checkpoint | None,
             restarts: int, learner):
    """The run's counters; on rank 0 of a resume, the checkpoint's weights and Adam state in
    `learner` (the others take them from its broadcast)."""
    from ddrl.loop.bookkeeping import Counters

    if ckpt is None:
        return Counters(restarts=restarts)
    if world.is_root:
        if ckpt.weights.size != learner.num_params:
            raise DdrlError(f"--resume: the checkpoint in {run_dir / 'checkpoints'} holds "
                            f"{ckpt.weights.size:,} weights, this job's model "
                            f"{learner.num_params:,}: resume it with its own job file")
        learner.set_weights(ckpt.weights)
        learner.set_optimizer_state(ckpt.optimizer)
    return Counters(ckpt.update, ckpt.frames, ckpt.wall_time, restarts)


def _root_outputs(cfg: Config, world, run_dir: Path, ckpt: checkpoint.Checkpoint | None,
                  counters, learner, sync, spec, cores: int):
    """Rank 0's log (created, or resumed at the checkpoint), its mirrors and the background
    evaluator."""
    from ddrl.commands.info import cpu_summary, versions
    from ddrl.cpus import deterministic_node
    from ddrl.loop.evaluator import BackgroundEvaluator
    from ddrl.models import compute_precision
    from ddrl.rundir.log import RunLog

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(cfg.to_toml())
    precision = compute_precision(cfg.model)
    attrs = {"config": cfg.to_json(), "world_size": world.size, "nodes": world.hosts,
             "versions": json.dumps(versions()), "sync_backend": sync.name,
             "precision": precision, "cpu": cpu_summary(), "cores": cores * world.size}
    if ckpt is None:
        attrs["start_time"] = datetime.datetime.now().astimezone().isoformat()
        log = RunLog.create(run_dir / "log.h5", attrs)
    else:
        log = RunLog.resume(run_dir / "log.h5", counters.update, counters.frames,
                            counters.restarts, attrs)
        if log.damaged:
            say(f"[ddrl] {log.damaged}: set aside as {log.set_aside.name}; "
                "the run goes on in a new log with the rows that could be read", err=True)
    if cfg.run.tensorboard:
        events = EventWriter(run_dir / "tensorboard", start_timestamp(log.attrs.get("start_time")))
        if ckpt is not None:
            # Rows at the checkpoint's own frames stay; what came after, the run plays again.
            events.restart(counters.frames + 1)
        log.mirrors.append(events)
    if cfg.run.wandb:
        try:
            log.mirrors.append(wandb_writer.WandbWriter(
                cfg.run.wandb, run_dir, str(log.attrs.get("start_time")), cfg.to_dict()))
        except DdrlError as exc:  # a mirror is optional: the run goes on without it
            say(f"ddrl: warning: {exc}; the run goes on without it", err=True)
    log.append("starts", {"restart": counters.restarts, "update": counters.update,
                          "frames": counters.frames, "wall_time": counters.wall_time,
                          "world_size": world.size, "nodes": world.hosts,
                          "damaged_log": int(log.damaged is not None)})
    evaluator = BackgroundEvaluator(cfg, spec, cores, deterministic_node(cfg), world.node_cpus) \
        if cfg.eval.episodes else None
    k = cfg.sync.virtual_ranks
    ranks = f"{world.size} rank(s)" if k == 1 else \
        f"{world.size * k} ranks ({world.size} process(es) x {k} virtual)"
    say(f"[ddrl] {cfg.env.id} {cfg.acting.mode} x {ranks} on {world.hosts} host(s), "
        f"{learner.num_params:,} parameters in {precision}, sync {sync.name}, run directory "
        f"{run_dir}" + (f" (resumed at update {counters.update})" if ckpt else ""))
    return log, evaluator
