"""`ddrl sweep JOB --sweep FILE --out DIR`: a sweep file's runs one after another on this
machine, as `sbatch --array=0-N slurm/array.sbatch JOB --sweep FILE --out DIR` runs them on a
cluster: the same lines, the same run directories (DIR_0, DIR_1, ...), each run under
`mpirun -n --ranks`, each rank bound to its share of the cores. `--array` picks lines as
sbatch's does (`--array 2,7`): those runs alone, in the same directories.

The command can be stopped and started again: a run that ended (its `ddrl train` exited 0:
frame budget, target or time limit) is marked finished and skipped; one that was stopped
(a signal, a crash, a reboot) resumes from its last checkpoint. SIGTERM, SIGUSR1 or Ctrl-C
reach the running run, which checkpoints before the sweep stops (exit 3).
"""
from __future__ import annotations

import argparse
import ctypes
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from ddrl.commands.args import job_file
from ddrl.commands.slurm import array_tasks, sweep_lines, task_config, train_args
from ddrl.distributed.launch import mpirun_command
from ddrl.errors import DdrlError, InUseError
from ddrl.rundir import hold

# Written into a run directory when its run ended on its own.
FINISHED = "sweep-finished"
# `ddrl train`'s exit after a signal made it checkpoint (ddrl.loop.trainer, which brings
# TensorFlow: not imported here).
EXIT_SIGNALLED = 3
EXIT_IN_USE = InUseError.exit_code
# Each run's sweep line, kept in its directory: a changed sweep file must not resume a run
# with another line's settings.
LINE = "sweep-line"
PR_SET_PDEATHSIG = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_file,
                   help="TOML job file or a recipe's name (a sweep line may name another)")
    p.add_argument("--sweep", required=True, metavar="FILE", type=job_file,
                   help="one run per line: `key=value ...`, optionally another job file; or a "
                        "recipe's name (six-games)")
    p.add_argument("--out", required=True, metavar="DIR", help="run i goes to DIR_i")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks per run (default 2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of every run (repeatable)")
    p.add_argument("--array", metavar="INDICES",
                   help="only these lines' runs, counted from 0 as sbatch --array counts them "
                        "(e.g. 2,7 or 0-5)")


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise DdrlError(f"--ranks {args.ranks}: a run needs at least 1 rank")
    launch = mpirun_command(args.ranks)
    # Every line checked before the first run starts: a typo on line 17 must not wait hours.
    lines = sweep_lines(args.sweep)
    runs = [task_config(args.job, args.set, args.sweep, task) for task in range(len(lines))]
    tasks = range(len(runs))
    if args.array is not None:
        if "%" in args.array:
            raise DdrlError(f"--array {args.array!r}: ddrl sweep runs one run at a time; "
                            "drop the %N limit")
        tasks = array_tasks(args.array, len(runs))
    # One sweep per --out: a second one (or a restarted one while the first still runs)
    # would start a second training of each line on the same cores.
    held = hold(Path(f"{args.out}.sweep"))
    try:
        return _run_tasks(args, launch, lines, runs, tasks)
    finally:
        held.close()


def _run_tasks(args: argparse.Namespace, launch: list[str], lines: list[list[str]],
               runs: list[tuple[str, list[str]]], tasks) -> int:
    failed, busy = [], []
    for task in tasks:
        job, sets = runs[task]
        run_dir = Path(f"{args.out}_{task}")
        text = shlex.join([*lines[task], *[f"--set={s}" for s in args.set]])
        name = f"run {task} of {len(runs)} ({' '.join(lines[task])})"
        kept = _kept_line(run_dir, text)
        if kept != text:
            failed.append(task)
            print(f"ddrl sweep: {name}: {run_dir} holds the run of another line ({kept!r}): "
                  "the sweep file changed; not resumed", flush=True)
            continue
        if (run_dir / FINISHED).exists():
            print(f"ddrl sweep: {name}: finished already, in {run_dir}", flush=True)
            continue
        print(f"ddrl sweep: {name}", flush=True)
        try:
            train = train_args(job, sets, run_dir)
        except InUseError:  # setting aside a log without a checkpoint needs the lock
            code, asked = EXIT_IN_USE, False
        else:
            code, asked = _run_forwarding_signals([*launch, sys.executable, "-m", "ddrl",
                                                   "train", *train])
        if code == EXIT_IN_USE:
            busy.append(task)
            print(f"ddrl sweep: run {task} is in use by another run (not failed); going on "
                  "with the next", flush=True)
        elif code == 0:
            (run_dir / FINISHED).touch()
        elif code < 0 or code == EXIT_SIGNALLED or asked:
            # `asked`: a signal that reached a rank as its run was ending (after its last
            # checkpoint) ends it by that signal; the resume then finds the run done.
            print(f"ddrl sweep: stopped during run {task}; the same command resumes it",
                  flush=True)
            return 3
        else:
            failed.append(task)
            print(f"ddrl sweep: run {task} failed (exit {code}); going on with the next",
                  flush=True)
    if busy and not failed:
        raise InUseError(f"runs {', '.join(map(str, busy))} of {args.sweep} are in use by "
                         "other runs; the same command takes them up once those end")
    if failed:
        raise DdrlError(f"runs {', '.join(map(str, failed))} of {args.sweep} failed; the same "
                        "command tries them again (finished runs are skipped)")
    return 0


def _kept_line(run_dir: Path, text: str) -> str:
    """The sweep line the run in `run_dir` was started with; `text` for a new one, which is
    kept with it from now on."""
    kept = run_dir / LINE
    if kept.is_file():
        return kept.read_text().strip()
    run_dir.mkdir(parents=True, exist_ok=True)
    kept.write_text(text + "\n")
    return text


def _run_forwarding_signals(cmd: list[str]) -> tuple[int, bool]:
    """The run's exit code, and whether a stop was asked for. SIGTERM, SIGINT, SIGHUP and
    SIGUSR1 to this process become a SIGUSR1 to mpirun, which hands it to every rank (they checkpoint and
    stop); Open MPI's own answer to SIGINT or SIGTERM is to kill the ranks. mpirun gets its
    own session so that a terminal's Ctrl-C reaches it only this way."""
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_stop_with_parent)
    asked = []

    def forward(signum, _frame):
        asked.append(signum)
        proc.send_signal(signal.SIGUSR1)

    # SIGHUP too: an SSH session that closes under a sweep must stop its run, not orphan it;
    # and SIGUSR1, `ddrl train`'s own stop (`timeout -s USR1`), which would end the sweep
    # silently, its run told only through its parent's death.
    old = {s: signal.signal(s, forward)
           for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)}
    try:
        return proc.wait(), bool(asked)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _stop_with_parent() -> None:
    """In the child before mpirun starts: a SIGUSR1 (checkpoint and stop) when the sweep dies
    however it dies (SIGKILL, an OOM kill), so that no run outlives it and a restarted sweep
    never trains a second copy beside it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
