"""Several hosts on one machine, for the multi-node tests and benchmarks: each host is a
network namespace with its own address and host name, joined to the others by a veth pair on
one bridge, optionally rate-limited per link (`tc tbf`: this kernel has no `netem`, so no added
latency). Open MPI starts its daemons in them through an rsh agent that enters the namespace,
so ranks on different hosts talk over TCP through the links, never through shared memory.
Needs root (`ip netns`, `nsenter`, `unshare`)."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddrl.errors import DdrlError

# Bridges ddrlbr0..ddrlbr{MAX_NETS-1}, each on 10.77.<index>.0/24: an index is claimed by
# creating its bridge, so test runs side by side never share a subnet.
MAX_NETS = 200
PREFIX = "10.77"
# Where `ip netns add` pins the namespaces. Entered with nsenter rather than `ip netns exec`,
# which would also mount a sysfs of the namespace over /sys and hide the cgroup mounts that
# slurmd needs.
NETNS_DIR = "/run/netns"


@dataclass(frozen=True)
class Host:
    name: str       # its host name (what MPI_Get_processor_name returns on it)
    address: str    # the address ranks and daemons on it use
    netns: str      # its network namespace
    link: str       # the root side of its veth pair, where its traffic is counted


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], capture_output=True, text=True, check=True)


def available() -> str | None:
    """Why simulated hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    missing = [tool for tool in ("ip", "tc", "nsenter", "unshare", "mpirun")
               if shutil.which(tool) is None]
    return f"simulated hosts need {', '.join(missing)}" if missing else None


def _tbf(dev: str, rate_bits: float, netns: str | None = None) -> None:
    # A bucket of 10 ms at the rate (at least a few frames) keeps the rate without starving
    # TCP at high rates.
    burst = max(int(rate_bits / 8 / 100), 16 * 1514)
    prefix = ["-n", netns] if netns else []
    _tc(*prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_bits)}bit",
        "burst", str(burst), "latency", "200ms")


def parse_rate(text: str) -> float:
    """'100mbit', '1gbit', '10gbit' -> bits per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if text.lower().endswith(unit):
            try:
                return float(text[: -len(unit)]) * scale
            except ValueError:
                break
    raise DdrlError(f"link rate {text!r}: expected a number with kbit, mbit or gbit")


def _remove_net(index: int) -> None:
    # Deleting a namespace frees its end of a veth pair only once nothing holds the namespace
    # (a killed host's last process may still be exiting), so the next net of this index
    # could find the link name taken: the links go explicitly.
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"ddrl{index}v"):
            _ip("link", "delete", name, check=False)
    for netns in _ip("netns", "list").stdout.split():
        if netns.startswith(f"ddrl{index}-h"):
            pids = _ip("netns", "pids", netns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "delete", netns, check=False)
    _ip("link", "delete", f"ddrlbr{index}", check=False)


def _owner_alive(index: int) -> bool:
    alias = _ip("-o", "link", "show", f"ddrlbr{index}", check=False).stdout
    pid = alias.split("alias owner-", 1)[-1].split()[0] if "alias owner-" in alias else ""
    try:
        os.kill(int(pid), 0)
        return True
    except (ValueError, ProcessLookupError):
        return False


class SimulatedHosts:
    """`with SimulatedHosts(3, rate="1gbit") as net:` makes hosts h1..h3; `net.mpirun(...)`
    starts ranks on them; leaving the block kills what still runs in them and removes them
    (a net whose creator died is removed by the next one that needs its index)."""

    def __init__(self, count: int, rate: str | None = None) -> None:
        if count < 1:
            raise DdrlError("simulated hosts: need at least 1 host")
        self.count = count
        self.rate = rate
        self.index = -1
        self.hosts: list[Host] = []
        self._dir = Path(tempfile.mkdtemp(prefix="ddrl-hosts-"))

    def __enter__(self) -> SimulatedHosts:
        reason = available()
        if reason:
            raise DdrlError(reason)
        self.index = self._claim()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claim(self) -> int:
        for index in range(MAX_NETS):
            bridge = f"ddrlbr{index}"
            if _ip("link", "add", bridge, "type", "bridge", check=False).returncode == 0:
                _ip("link", "set", bridge, "alias", f"owner-{os.getpid()}")
                return index
            if not _owner_alive(index):
                _remove_net(index)
                if _ip("link", "add", bridge, "type", "bridge", check=False).returncode == 0:
                    _ip("link", "set", bridge, "alias", f"owner-{os.getpid()}")
                    return index
        raise DdrlError(f"simulated hosts: all {MAX_NETS} bridge indices are in use")

    def _build(self) -> None:
        bridge, net = f"ddrlbr{self.index}", f"{PREFIX}.{self.index}"
        _ip("addr", "add", f"{self.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(1, self.count + 1):
            host = Host(name=f"h{i}", address=f"{net}.{10 + i}", netns=f"ddrl{self.index}-h{i}",
                        link=f"ddrl{self.index}v{i}")
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("link", "set", host.link, "master", bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            self.hosts.append(host)
        if self.rate:
            self.limit(self.rate)
        self._write_agent()

    def limit(self, rate: str | None) -> None:
        """Each host's link limited to `rate` each way (None: unlimited)."""
        for host in self.hosts:
            if rate is None:
                _tc("-n", host.netns, "qdisc", "delete", "dev", "eth0", "root")
                _tc("qdisc", "delete", "dev", host.link, "root")
            else:
                bits = parse_rate(rate)
                _tbf("eth0", bits, host.netns)   # what the host sends
                _tbf(host.link, bits)            # what it receives
        self.rate = rate

    @property
    def gateway(self) -> str:
        """The bridge's address in this machine's own namespace: daemons there (mpirun, a
        slurmctld) are reached by the hosts at it."""
        return f"{PREFIX}.{self.index}.1"

    def inside(self, host: Host, argv: list[str]) -> list[str]:
        """argv run on `host`: in its network namespace, under its host name."""
        return ["nsenter", f"--net={NETNS_DIR}/{host.netns}", "unshare", "--uts", "sh", "-c",
                f'hostname {host.name}; exec "$@"', "sh", *argv]

    def _write_agent(self) -> None:
        # Open MPI runs `AGENT HOST ORTED-COMMAND...`; the daemon (and the ranks it starts)
        # run inside the host's namespace, with the host's name in a UTS namespace of their own.
        # The orted command arrives as words for a remote shell: a shell parses it again.
        cases = "\n".join(f'  {h.address}) exec {shlex.join(self.inside(h, ["sh", "-c"]))} "$*" ;;'
                          for h in self.hosts)
        agent = self._dir / "agent"
        agent.write_text(
            "#!/bin/sh\n"
            'host="$1"; shift\n'
            'case "$host" in\n'
            f"{cases}\n"
            '  *) echo "ddrl simulated hosts: unknown host $host" >&2; exit 1 ;;\n'
            "esac\n")
        agent.chmod(0o755)

    def mpirun(self, per_host: list[int]) -> list[str]:
        """`mpirun` for per_host[i] ranks on host i+1, ranks numbered host by host (so the
        last host holds the last ranks: parameter servers, when there are any)."""
        if len(per_host) > len(self.hosts) or any(n < 0 for n in per_host):
            raise DdrlError(f"simulated hosts: {per_host} ranks per host on {self.count} hosts")
        hostfile = self._dir / "hostfile"
        hostfile.write_text("".join(f"{h.address} slots={n}\n"
                                    for h, n in zip(self.hosts, per_host) if n))
        net = f"{PREFIX}.{self.index}.0/24"
        cmd = [shutil.which("mpirun") or "mpirun", "-n", str(sum(per_host)),
               "--hostfile", str(hostfile), "--map-by", "slot", "--bind-to", "none",
               "--mca", "plm_rsh_agent", str(self._dir / "agent"),
               "--mca", "oob_tcp_if_include", net, "--mca", "btl_tcp_if_include", net,
               "--mca", "btl", "tcp,vader,self"]
        return cmd + (["--allow-run-as-root"] if os.geteuid() == 0 else [])

    def traffic(self) -> dict[str, tuple[int, int]]:
        """Bytes each host has (received, sent) over its link so far."""
        out = {}
        for host in self.hosts:
            stats = Path("/sys/class/net") / host.link / "statistics"
            # The root side's tx is what the host received, its rx what the host sent.
            out[host.name] = (int((stats / "tx_bytes").read_text()),
                              int((stats / "rx_bytes").read_text()))
        return out

    def close(self) -> None:
        if self.index >= 0:
            _remove_net(self.index)
            self.index = -1
        self.hosts = []
        shutil.rmtree(self._dir, ignore_errors=True)
