"""The evaluator's own process: `python -m ddrl.loop.eval_worker FD_IN FD_OUT CPUS`, started by
rank 0's `BackgroundEvaluator`. It plays the evaluations it is sent with a TensorFlow and
simulators of its own, at a lower CPU priority, on the CPUs listed (comma-separated; empty: rank
0's), and reports each result with the CPU time it took.

A process, not a thread of rank 0: a thread shared rank 0's GIL and TensorFlow pools with the
trainer, which then waited on it; the whole job waited on rank 0 in the all-reduce.
"""
from __future__ import annotations

import os
import queue
import resource
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from ddrl.cpus import each_thread

if TYPE_CHECKING:  # imported at run time only once TensorFlow is configured
    from ddrl.config import Config
    from ddrl.learner import Learner
    from ddrl.loop.evaluator import Pools


def cpu_seconds() -> float:
    """This process's CPU time, all its threads (TensorFlow's, the emulator's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def lower_priority(nice: int) -> None:
    """Every thread of this process at niceness `nice` (Linux's is per thread, inherited by the
    threads each creates: TensorFlow's pools exist by now, the simulators' come later)."""
    each_thread(lambda tid: os.setpriority(os.PRIO_PROCESS, tid, nice))


def main(fd_in: int, fd_out: int, cpus: set[int]) -> int:
    if cpus:
        # Before any thread exists: the threads started below (TensorFlow's pools, the
        # simulators') inherit it.
        os.sched_setaffinity(0, cpus)
    # Stop signals are rank 0's to act on (a terminal's Ctrl-C, Slurm's warnings reach the
    # whole process group): it ends this process, or this process sees its pipe close.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    inbox, outbox = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    jobs: queue.Queue = queue.Queue()
    gone = threading.Event()

    def read() -> None:
        """Rank 0's messages, taken as they come (rank 0 never blocks on a full pipe, even
        while TensorFlow loads here); its end (a pipe closed by exit or SIGKILL) abandons the
        game in progress."""
        while True:
            try:
                jobs.put(inbox.recv())
            except (EOFError, OSError):
                gone.set()
                jobs.put(None)
                return

    threading.Thread(target=read, daemon=True, name="eval-inbox").start()
    if (setup := jobs.get()) is None:
        return 0
    cfg, spec, nice, deterministic = setup
    from ddrl.cpus import configure_tensorflow

    # One core's worth: a batch of at most 16 observations gains little from more threads.
    configure_tensorflow(1, deterministic)
    from ddrl.learner import Learner
    from ddrl.loop.evaluator import Pools

    learner = Learner(cfg, *spec)
    # Start-up (TensorFlow's import, the model's build) happens once a run, as the ranks' own
    # does, at their priority: at niceness 19 on busy cores it would take minutes. The budget
    # counts the evaluations' CPU time, not it.
    lower_priority(nice)
    pools = Pools()
    try:
        return serve(cfg, learner, pools, jobs, outbox, gone)
    finally:
        pools.close()


def serve(cfg: Config, learner: Learner, pools: Pools, jobs: queue.Queue,
          outbox: Connection, gone: threading.Event) -> int:
    """The evaluations sent, played one after another until rank 0 is gone; the exit code."""
    from ddrl.loop.evaluator import evaluate, out_of_reach

    while (job := jobs.get()) is not None:
        weights, update, episodes, seed, prior, cores = job
        started = cpu_seconds()
        try:
            learner.set_weights(weights)
            res = evaluate(cfg, learner, episodes, seed, gone, out_of_reach(cfg, episodes, prior),
                           cores, pools=pools)
        except Exception:
            outbox.send(("error", update, traceback.format_exc()))
            return 1
        if res is None:
            return 0
        try:
            outbox.send(("done", update, res, cpu_seconds() - started))
        except (BrokenPipeError, OSError):
            return 0
    return 0

if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]),
                  {int(c) for c in sys.argv[3].split(",") if c}))
