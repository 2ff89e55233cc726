"""How many cores this rank owns, so N ranks on a node do not oversubscribe it, and how much
memory it may still take.

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
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from ddrl.config import Config

T = TypeVar("T")


def each_thread(fn: Callable[[int], T]) -> list[T]:
    """`fn(thread id)` for every thread of this process (Linux keeps niceness and affinity per
    thread: one started before a change would keep the old), skipping one that ended since the
    listing."""
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            out.append(fn(int(task)))
        except ProcessLookupError:
            pass
    return out


def cores_per_rank(requested: int, local_ranks: int) -> int:
    """`acting.threads`, else Slurm's cpus-per-task, else OMP_NUM_THREADS, else this process's
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


def peak_flops_per_cycle(precision: str = "float32") -> tuple[int, str] | None:
    """A core's arithmetic bound in FLOP per cycle (a fused multiply-add counts 2) and the
    reason, from the CPU's vendor, family and flags; None where the generation is unknown.
    Virtual machines often hide the model name, never the family. bfloat16 counts only native
    units: AMX tiles, else AVX512-BF16's dot products (twice the float32 lanes)."""
    info, flags = cpuinfo(), cpu_flags()
    vendor, family = info.get("vendor_id", ""), int(info.get("cpu family", "0") or 0)
    if vendor == "AuthenticAMD" and family >= 25:
        # Zen 3: two 256-bit FMA pipes; Zen 4: AVX-512 on the same 256-bit pipes, twice each;
        # Zen 5 (family 26): full 512-bit pipes.
        fp32, why = (64, "AMD Zen 5: 2 x 512-bit FMA") if family >= 26 else (
            32, "AMD Zen 3/4: 2 x 256-bit FMA")
    elif vendor == "GenuineIntel" and "avx512f" in flags:
        fp32, why = 64, "Intel AVX-512: 2 x 512-bit FMA (server parts)"
    elif "fma" in flags:
        fp32, why = 32, "2 x 256-bit FMA"
    else:
        return None
    if precision == "float32":
        return fp32, why
    if "amx_bf16" in flags:
        return 1024, "AMX-BF16 tiles"
    if "avx512_bf16" in flags:
        return 2 * fp32, why + ", AVX512-BF16 dot products"
    return None


def configure_tensorflow(cores: int, deterministic: bool) -> None:
    import tensorflow as tf

    # Intra-op threads do the work of one op (a convolution); a second inter-op thread lets
    # the predictor's and the trainer's ops run side by side instead of queueing.
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, cores)))
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def start_tensorflow(cfg: "Config", local_ranks: int) -> int:
    """TensorFlow sized to this rank's cores, `local_ranks` sharing the node (deterministic
    where the node mode allows it) and seeded from run.seed, before any network is built; the
    cores."""
    from ddrl.seeding import derive_seed

    cores = cores_per_rank(cfg.acting.threads, local_ranks)
    configure_tensorflow(cores, deterministic_node(cfg))
    import tensorflow as tf

    tf.keras.utils.set_random_seed(derive_seed(cfg.run.seed, 0, "init"))
    return cores


def deterministic_node(cfg: "Config") -> bool:
    """The node modes that run in a fixed order on one thread (a2c, dqn) reproduce a run."""
    return cfg.acting.mode in ("a2c", "dqn")


# cgroup v1 writes "no limit" as the largest page-aligned int64.
_V1_UNLIMITED = 1 << 62


def available_memory(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")
                     ) -> int | None:
    """What this process can allocate without swapping or an OOM kill: the kernel's
    MemAvailable, or less where a memory cgroup on its path has a limit, the tightest of all:
    Slurm's task/cgroup plugin sets it on the job or step, a parent of the task's own group,
    under cgroup v2 (memory.max) or v1 (memory.limit_in_bytes). None where nothing is readable."""
    found = []
    try:
        found += [int(line.split()[1]) * 1024 for line in (proc / "meminfo").read_text().splitlines()
                  if line.startswith("MemAvailable:")]
    except (OSError, ValueError):
        pass
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            found += _headroom(cgroups, path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            # Mounted under the controllers' joint name, or (symlinked) under memory/.
            for mount in {cgroups / controllers, cgroups / "memory"}:
                found += _headroom(mount, path, "memory.limit_in_bytes", "memory.usage_in_bytes")
    return min(found) if found else None


def _headroom(mount: Path, path: str, limit_file: str, usage_file: str) -> list[int]:
    """limit - usage of every group from `path` up to the hierarchy's root that has a limit."""
    out = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        group = mount.joinpath(*parts[:depth])
        try:
            limit = (group / limit_file).read_text().strip()
            if not limit.isdigit() or int(limit) >= _V1_UNLIMITED:
                continue  # "max" (v2) or v1's unlimited
            out.append(int(limit) - int((group / usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return out
