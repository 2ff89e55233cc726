"""A real Slurm cluster for tests: munged, slurmctld and slurmd in a temporary directory; one
node (this machine), or one slurmd per simulated host (ddrl/bench/simhosts.py) for multi-node
jobs whose ranks talk over the hosts' links.

Everything is private to the session: its own munge key and socket, its own ports, state and
spool directories, so it touches no system configuration and can run beside another test
session's cluster. Tests talk to it through `SLURM_CONF`, which the fixtures export.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from ddrl.bench.simhosts import SimulatedHosts

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "scancel", "sinfo", "squeue", "srun")
# Declared above a 2-core machine's hardware (slurmd accepts it with config_overrides) so a
# 2-task job and a 2-task array run side by side; the ranks share the real cores.
MIN_CPUS = 4
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass
class JobResult:
    job_id: str
    state: str
    exit_code: int
    signal: int
    restarts: int
    output: Path

    def text(self) -> str:
        return self.output.read_text() if self.output.is_file() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SlurmCluster:
    """Daemons started by `start` are the only ones `stop` ends (by their Popen handles)."""

    def __init__(self, root: Path, hosts: SimulatedHosts | None = None):
        self.root = root
        self.conf = root / "slurm.conf"
        self.host = socket.gethostname()
        self.hosts = hosts
        # The nodes: this machine, or the simulated hosts (slurmctld stays on this machine).
        self.nodes = [h.name for h in hosts.hosts] if hosts else [self.host]
        self._procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self, munge_socket: Path) -> None:
        cpus = max(MIN_CPUS, os.cpu_count() or 1)
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        r = self.root
        # A simulated host killed by a test is declared down after this many seconds (default
        # 300); the single-node cluster keeps the default, so a loaded machine never loses it.
        timeout = "SlurmdTimeout=20" if self.hosts else ""
        if self.hosts:
            ctl_addr = self.hosts.gateway
            nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} "
                              f"RealMemory={mem_mb // len(self.nodes)} State=UNKNOWN"
                              for h in self.hosts.hosts)
        else:
            ctl_addr = "127.0.0.1"
            nodes = (f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} "
                     "State=UNKNOWN")
        for d in ("state", "spool"):
            (r / d).mkdir()
        self.conf.write_text(f"""\
ClusterName=ddrltest
SlurmctldHost={self.host}({ctl_addr})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's next start (default 120 s).
AuthInfo=socket={munge_socket},cred_expire=5
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MpiDefault=none
MailProg=/bin/true
# Finished jobs stay visible to `scontrol show job` (there is no slurmdbd for sacct).
MinJobAge=3600
# A step's tasks left after one failed (srun -K1) are killed this long after their SIGTERM
# (default 30 s): a rank blocked on a lost peer ignores the signal, so it sets when a lost-rank
# restart begins. ddrl's orderly stops (scancel, requeue) end within 2-3 s of theirs.
KillWait=10
# Schedule (and start requeued jobs) within seconds instead of the default minute.
SchedulerParameters=sched_interval=2,bf_interval=1
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
# Per node: the PMIx plugin makes its directories there, which nodes on one machine must not share.
TmpFS={r}/tmp/%n
{timeout}
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
{nodes}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def _spawn(self, name: str, *args: str, prefix=lambda argv: argv, log_name: str = "") -> None:
        log = open(self.root / f"{log_name or name}.out", "wb")
        self._procs.append(subprocess.Popen(prefix([name, *args]), stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env, cwd=self.root))
        log.close()

    def _wait_until(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {f.name}\n{_tail(f)}" for f in self.root.glob("*.out"))
                raise RuntimeError(f"Slurm test cluster: {what} (exited: {dead})\n{logs}\n"
                                   f"--- slurmctld.log\n{_tail(self.root / 'slurmctld.log')}")
            time.sleep(0.5)

    def start(self) -> None:
        key, sock = self.root / "munge.key", self.root / "munge.sock"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # --force: munged refuses to run as root or with a socket outside /run/munge otherwise.
        self._spawn("munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                    f"--pid-file={self.root / 'munged.pid'}", f"--seed-file={self.root / 'munged.seed'}",
                    f"--log-file={self.root / 'munged.log'}")
        self._wait_until("munged did not create its socket", sock.exists, 15)
        self._write_conf(sock)
        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        for node in self.nodes:
            for d in ("spool", "tmp"):
                (self.root / d / node).mkdir(parents=True)
        if self.hosts:
            for host in self.hosts.hosts:
                self._spawn("slurmd", "-D", "-N", host.name, "-f", str(self.conf),
                            prefix=lambda argv, h=host: self.hosts.inside(h, argv),
                            log_name=f"slurmd-{host.name}")
        else:
            self._spawn("slurmd", "-D", "-f", str(self.conf))
        self._wait_until("the nodes did not become idle", self._nodes_idle, 60)

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.split()
        return out == ["idle"] * len(self.nodes)

    def stop(self) -> None:
        if any(p.args[0] == "slurmctld" and p.poll() is None for p in self._procs):
            self.run("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + 30
            while self.run("squeue", "-h", "-t", "R,CG", check=False).stdout.strip() \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in reversed(self._procs):
            _stop(proc)
        self._procs.clear()

    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True,
                              check=check, timeout=kw.pop("timeout", 60), **kw)

    def submit(self, script: str | Path, *args: str, options: tuple[str, ...] = (),
               env: dict[str, str] | None = None, cwd: Path | None = None,
               stdin: str | None = None) -> str:
        """`sbatch --parsable`; output goes to ROOT/out/<job id>.out unless options say."""
        (self.root / "out").mkdir(exist_ok=True)
        cmd = ["sbatch", "--parsable", f"--output={self.root}/out/%j.out", *options,
               *([str(script)] if script else []), *args]
        proc = self.run(*cmd, env={**self.env, **(env or {})}, cwd=cwd, input=stdin, check=False)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        return proc.stdout.strip().split(";")[0]

    def records(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` records: one, or one per task (and pending rest) of an array."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return [dict(_FIELD.findall(line)) for line in out.splitlines() if line.strip()]

    def state(self, job_id: str) -> str:
        return self.records(job_id)[0]["JobState"]

    def wait(self, job_id: str, timeout: float, states: frozenset[str] = FINAL_STATES
             ) -> list[JobResult]:
        """Wait until the job (every task of an array) is in one of `states`, a final state
        unless told; on timeout, cancel it and fail with its output. Results are ordered by
        array task id."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.records(job_id)
            if all(r["JobState"] in states for r in recs):
                break
            if time.monotonic() > deadline:
                self.run("scancel", job_id, check=False)
                outputs = "\n".join(_tail(Path(r.get("StdOut", "")), 40) for r in recs)
                pytest.fail(f"job {job_id} not finished after {timeout:.0f} s: "
                            f"{[r['JobState'] for r in recs]}\n{outputs}")
            time.sleep(1)
        recs.sort(key=lambda r: int(r.get("ArrayTaskId", "0")))
        results = []
        for r in recs:
            code, sig = (int(x) for x in r["ExitCode"].split(":"))
            results.append(JobResult(r["JobId"], r["JobState"], code, sig, int(r["Restarts"]),
                                     Path(r["StdOut"])))
        return results


def missing_requirements() -> str | None:
    """Why a local cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "a private one-node Slurm cluster needs root (SlurmUser=root)"
    missing = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None]
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    return None


@contextlib.contextmanager
def running(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster started with SLURM_CONF pointing at it; stopped and SLURM_CONF restored
    afterwards."""
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with running(SlurmCluster(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_hosts_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A 2-node cluster: one slurmd in each of 2 simulated hosts."""
    from ddrl.bench.simhosts import available

    reason = missing_requirements() or available()
    if reason:
        pytest.skip(reason)
    with SimulatedHosts(2) as hosts, \
            running(SlurmCluster(tmp_path_factory.mktemp("slurm-hosts"), hosts)) as cluster:
        yield cluster
