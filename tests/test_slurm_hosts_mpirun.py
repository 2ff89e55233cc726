"""The batch scripts' mpirun launcher on the 2-node cluster of simulated hosts (a module of
its own: the test leaves its cluster with one node)."""
from __future__ import annotations

from slurm_cluster import slurm_hosts_cluster  # noqa: F401  (the fixture)
from test_slurm_hosts import lose_a_host


def test_mpirun_launcher_restarts_on_the_host_left(slurm_hosts_cluster, tmp_path):
    """mpirun takes its node list from the job's start, the lost host in it: the restart names
    the hosts left (`--host h1:1 -n 1`)."""
    text = lose_a_host(slurm_hosts_cluster, tmp_path / "run",
                       env={"DDRL_LAUNCHER": "mpirun", "DDRL_MPIRUN_ARGS": "--bind-to none"})
    assert ("mpirun --bind-to none --allow-run-as-root -x DDRL_EXIT_FILE "
            "--mca odls_base_sigkill_timeout 10 -n 1 --host h1:1") in text, text
