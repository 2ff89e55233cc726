"""`ddrl train | eval | bench | analyze | export | info | slurm`: one parser; commands live in
their modules."""
from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import os
import sys
import threading
from typing import NoReturn

from ddrl.errors import DdrlError, EveryRankError, HardExitError, storage_errors
from ddrl.output import say

# command -> (module, help). Each module has `add_arguments(parser)` and `run(args) -> int`;
# modules are imported only for the chosen command, so `ddrl info` does not load TF twice.
COMMANDS = {
    "train": ("ddrl.commands.train", "train an agent from a TOML job file"),
    "eval": ("ddrl.commands.evaluate", "evaluate the latest checkpoint of a run directory"),
    "bench": ("ddrl.bench", "benchmarks: node throughput, all-reduce, SB3 comparison"),
    "analyze": ("analysis.cli", "summaries and figures from run logs"),
    "export": ("analysis.tensorboard", "write run logs as TensorBoard event files"),
    "status": ("analysis.status", "one line per run: state, progress, speed, scores, time left"),
    "info": ("ddrl.commands.info", "versions, CPU features, model sizes"),
    "slurm": ("ddrl.commands.slurm", "print a ready sbatch script for a job file"),
    "sweep": ("ddrl.commands.sweep", "a sweep file's runs one after another on this machine, "
                            "resumable (the workstation's job array)"),
    "recipes": ("ddrl.recipe", "the job files that come with ddrl, a line each (`ddrl train "
                               "NAME` runs one)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
        else:
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _report_exit(command: str, code: int) -> None:
    """Rank 0 of `ddrl train` writes its exit code to DDRL_EXIT_FILE where the batch script
    (slurm/launch.sh) set it: the launcher is then given a grace period to end, not forever."""
    from ddrl.distributed.world import launcher_rank

    path = os.environ.get("DDRL_EXIT_FILE")
    if command == "train" and path and launcher_rank() == 0:
        try:
            with open(path, "w") as f:
                f.write(f"{code}\n")
        except OSError as exc:
            say(f"[ddrl] warning: cannot write DDRL_EXIT_FILE ({exc}): the batch script "
                "waits for the launcher without a grace period", err=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    code = _run(args)
    _report_exit(args.command, code)
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        # A full disk or quota under `ddrl analyze`'s figures or `ddrl export`'s events too.
        with storage_errors():
            return importlib.import_module(COMMANDS[args.command][0]).run(args) or 0
    except EveryRankError as exc:
        from ddrl.distributed.world import launcher_rank

        if launcher_rank() == 0:
            say(f"ddrl: error: {exc}", err=True)
        return exc.exit_code
    except DdrlError as exc:
        say(f"ddrl: error: {exc}", err=True)
        if isinstance(exc, HardExitError):
            _report_exit(args.command, exc.exit_code)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        say("ddrl: interrupted", err=True)
        return 130
    except BrokenPipeError:
        # `ddrl analyze ... | head`: the reader left; not an error worth a traceback.
        sys.stderr.close()
        return 0


def entry() -> NoReturn:
    """The `ddrl` command and `python -m ddrl`: `main`, then the process's end (with
    DDRL_FAST_EXIT=1, as the test suite sets it, without Python's teardown)."""
    code = main()
    if os.environ.get("DDRL_FAST_EXIT") == "1" and "tensorflow" in sys.modules and all(
            t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        _exit_without_teardown(code)
    sys.exit(code)


def _exit_without_teardown(code: int) -> NoReturn:
    """The end of a normal exit without Python's teardown of every object TensorFlow made,
    which takes about a second a process (each rank of each run; a test suite of short runs
    spends minutes in it). Opt-in: it calls the private `atexit._run_exitfuncs`, the price of
    those minutes. What a normal exit does for the program is kept: Python's exit
    handlers (multiprocessing's joins, Horovod's shutdown), MPI_Finalize (mpi4py would call it
    last of all), the standard streams flushed, and C's exit, whose handlers close HDF5."""
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left, a stream closed (BrokenPipeError)
            pass
    ctypes.CDLL(None).exit(code)


if __name__ == "__main__":
    entry()
