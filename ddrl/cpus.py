"""How many cores this rank owns, so N ranks on a node do not oversubscribe it."""
from __future__ import annotations

import os


def cores_per_rank(requested: int, local_ranks: int) -> int:
    """`node.threads`, else Slurm's cpus-per-task, else OMP_NUM_THREADS, else this process's
    affinity mask shared among the ranks on this node (mpirun --bind-to none leaves it whole)."""
    if requested:
        return requested
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    mask = len(os.sched_getaffinity(0))
    return max(1, mask // local_ranks if mask >= os.cpu_count() else mask)


def configure_tensorflow(cores: int, deterministic: bool) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(cores)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, cores)))
    if deterministic:
        tf.config.experimental.enable_op_determinism()
