"""How many cores this rank owns, so N ranks on a node do not oversubscribe it.

A rank runs its simulators (C++ threads), predictor and trainer threads and TensorFlow's
thread pools; all of them should stay on the rank's own cores. Bind each rank to a block of
cores and TensorFlow sizes its pools from that block:

- Open MPI: `mpirun -n N --map-by slot:PE=C --bind-to core` (C = cores per rank; on
  several nodes `--map-by ppr:R:node:PE=C`). `--bind-to none` leaves every rank the whole
  machine, and ranks then split it evenly by their local count.
- Slurm: `srun --cpus-per-task=C --cpu-bind=cores` (sbatch `--cpus-per-task=C`); Slurm
  exports SLURM_CPUS_PER_TASK, which wins over the affinity mask.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path


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


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (model name, cpu family, model, flags, ...);
    empty where it is unreadable."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, sep, value in
            (line.partition(":") for line in first.splitlines()) if sep}


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (none where /proc/cpuinfo is unreadable)."""
    return frozenset(cpuinfo().get("flags", "").split())


def configure_tensorflow(cores: int, deterministic: bool) -> None:
    import tensorflow as tf

    # Intra-op threads do the work of one op (a convolution); a second inter-op thread lets
    # the predictor's and the trainer's ops run side by side instead of queueing.
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, cores)))
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def start_tensorflow(cfg, world) -> int:
    """TensorFlow sized to this rank's cores (deterministic where the node mode allows it) and
    seeded from run.seed, before any network is built; the cores."""
    from ddrl.seeding import derive_seed

    cores = cores_per_rank(cfg.node.threads, world.local_size)
    configure_tensorflow(cores, deterministic_node(cfg))
    import tensorflow as tf

    tf.keras.utils.set_random_seed(derive_seed(cfg.run.seed, 0, "init"))
    return cores


def deterministic_node(cfg) -> bool:
    """The node modes that run in a fixed order on one thread (a2c, dqn) reproduce a run."""
    return cfg.node.mode in ("a2c", "dqn")
