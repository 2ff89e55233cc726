"""The one place that builds `mpirun` command lines: benchmarks, stragglers and the tests
start their ranks through it, so the flags Open MPI needs here (root, binding,
oversubscription) are decided once."""
from __future__ import annotations

import os
import shutil
import sys

from ddrl.errors import DdrlError


def mpirun_command(ranks: int, bind: bool = True) -> list[str]:
    """`mpirun -n N` for this machine. Bound: each rank on its own block of cores (see
    ddrl/cpus.py); with more ranks than cores, or `bind=False`, unbound and oversubscribed,
    so the ranks share the cores evenly."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise DdrlError("mpirun not found: install Open MPI, or start this under srun or mpirun")
    cmd = [mpirun, "-n", str(ranks)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    per_rank = len(os.sched_getaffinity(0)) // ranks
    if bind and per_rank >= 1:
        return [*cmd, "--map-by", f"slot:PE={per_rank}", "--bind-to", "core"]
    return [*cmd, "--oversubscribe", "--bind-to", "none"]


if __name__ == "__main__":
    # `python -m ddrl.distributed.launch N`: the command line, for the Makefile's `make run`.
    print(" ".join(mpirun_command(int(sys.argv[1]))))
