"""The memory a rank may still take: the tightest cgroup limit on its path, v1 or v2, parents
included (Slurm sets the job's limit on a parent of the task's group)."""
from __future__ import annotations

from pathlib import Path

from ddrl.cpus import available_memory

GIB = 1 << 30


def machine(tmp_path: Path, cgroup_line: str, groups: dict[str, dict[str, int | str]]
            ) -> tuple[Path, Path]:
    """A /proc and a /sys/fs/cgroup laid out as the kernel shows them, 256 GiB available."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {300 * GIB // 1024} kB\n"
                                  f"MemAvailable: {256 * GIB // 1024} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for group, files in groups.items():
        d = root / group
        d.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (d / name).write_text(f"{value}\n")
    return proc, root


def test_v2_limit_on_the_job_a_parent_of_the_tasks_group(tmp_path):
    job = "system.slice/slurmstepd.scope/job_7"
    proc, root = machine(tmp_path, f"0::/{job}/step_0/user/task_0", {
        job: {"memory.max": 16 * GIB, "memory.current": 2 * GIB},
        f"{job}/step_0": {"memory.max": "max", "memory.current": 2 * GIB},
        f"{job}/step_0/user/task_0": {"memory.max": "max", "memory.current": GIB},
    })
    assert available_memory(proc, root) == 14 * GIB


def test_v1_memory_controller_with_the_limit_on_a_parent(tmp_path):
    job = "slurm/uid_0/job_7"
    unlimited = 9223372036854771712
    proc, root = machine(tmp_path, f"4:memory:/{job}/step_0/task_0", {
        f"memory/{job}": {"memory.limit_in_bytes": 16 * GIB, "memory.usage_in_bytes": 4 * GIB},
        f"memory/{job}/step_0": {"memory.limit_in_bytes": unlimited,
                                 "memory.usage_in_bytes": 4 * GIB},
        f"memory/{job}/step_0/task_0": {"memory.limit_in_bytes": unlimited,
                                        "memory.usage_in_bytes": GIB},
    })
    assert available_memory(proc, root) == 12 * GIB


def test_no_limit_leaves_the_kernels_figure(tmp_path):
    proc, root = machine(tmp_path, "0::/user.slice", {"user.slice": {"memory.max": "max",
                                                                     "memory.current": GIB}})
    assert available_memory(proc, root) == 256 * GIB
