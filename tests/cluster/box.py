"""Cluster in a box: N "machines" on this host, each with its own network, memory and CPU.

A machine is a network namespace joined by a veth to a bridge on a private 10.232.<n>.0/24
made for the box (nothing else is touched), a memory cgroup (v2 `memory.max` when the unified
hierarchy has the memory controller, else v1 `memory.limit_in_bytes`) with a CPU share, a tbf
bandwidth limit on both ends of its link, and, for a round-trip time (this kernel has no netem),
a delaying proxy (tests/cluster/proxy.py) on the bridge that the machine announces as its
address. Machines run real `python -m drift.cli` processes. `close` (also on failure, and at
exit) kills every process, removes namespaces, links and cgroups. Needs root.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.procs import PrefixedProc, free_port
from tests.procs import DriftProc

CG = Path("/sys/fs/cgroup")
PORT = 31337  # drift up's default port: every machine has its own network, so all use it
ENTER = 'for f in $BOX_CGROUP_PROCS; do echo $$ > "$f"; done; exec "$@"'


def why_not() -> str | None:
    """Why a box cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the cluster box needs root (network namespaces, cgroups, tc)"
    missing = [t for t in ("ip", "tc", "nsenter") if shutil.which(t) is None]
    if missing:
        return f"the cluster box needs {', '.join(missing)}"
    if cgroup_version() is None:
        return "no memory cgroup (v1 or v2) is mounted under /sys/fs/cgroup"
    return None


def cgroup_version() -> int | None:
    controllers = CG / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return 2
    return 1 if (CG / "memory" / "memory.limit_in_bytes").is_file() else None


def own_cgroup(controller: str) -> Path:
    """This process's own cgroup directory for a v1 controller ("" for v2): boxes nest in it,
    so whatever limits this process has still cover the machines."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (not controller and not names):
            base = CG / controller if controller else CG
            d = base / path.lstrip("/")
            return d if d.is_dir() else base
    return CG / controller


def sh(*cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, check=check, capture_output=True, timeout=30)


@dataclass
class Machine:
    """One machine of the box: its namespace, address, cgroups and the processes it runs."""

    name: str
    ns: str
    ip: str  # its address on the bridge
    announce: str | None  # the proxy's host:port others reach it at (None: its own ip)
    cgroups: list[Path]  # cgroup directories its processes join
    memory: int  # bytes
    workdir: Path
    threads: int | None = 1  # OMP_NUM_THREADS of its processes; None: torch's default (all cores)
    procs: list[DriftProc] = field(default_factory=list)

    @property
    def memory_cgroup(self) -> Path:
        return self.cgroups[0]

    def run(self, args: list[str], env: dict[str, str] | None = None) -> DriftProc:
        """`python -m drift.cli *args` on this machine (its network, memory and CPU)."""
        procs = " ".join(str(c / "cgroup.procs") for c in self.cgroups)
        full = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path.cwd()),
                    DRIFT_CACHE=str(self.workdir / "cache"), BOX_CGROUP_PROCS=procs)  # fmt: skip
        full.pop("OMP_NUM_THREADS", None)
        if self.threads is not None:
            full["OMP_NUM_THREADS"] = str(self.threads)
        full.update(env or {})
        prefix = ["nsenter", f"--net=/var/run/netns/{self.ns}", "sh", "-c", ENTER, "sh"]
        proc = PrefixedProc(prefix, args, full)
        self.procs.append(proc)
        return proc

    def up(self, model: str, *args: str, env: dict[str, str] | None = None) -> DriftProc:
        """`drift up MODEL *args` here, announcing the delaying proxy when there is one."""
        where = ["--announce_maddrs", "/ip4/{}/tcp/{}".format(*self.announce.split(":"))] \
            if self.announce else []  # fmt: skip
        return self.run(["up", model, *args, *where], env)

    def kill(self) -> None:
        for p in self.procs:
            p.kill()

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this machine's memory cgroup."""
        for name in ("memory.events", "memory.oom_control"):
            f = self.memory_cgroup / name
            if f.is_file():
                for line in f.read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return 0


class Box:
    """N machines of `memory` bytes each on a bridge of `rate` with `rtt_ms` between them."""

    def __init__(self, n: int, workdir: Path, *, memory: int, rtt_ms: float = 0.0,
                 rate: str = "1gbit", cpu_weight: int = 100,
                 threads: int | None = 1) -> None:  # fmt: skip
        """`threads`: each machine's OMP_NUM_THREADS (1: several machines share this host's
        cores without spinning against each other); None: torch's default, every core, as a
        user's machine runs it (a benchmark of one session, where one machine computes at a
        time)."""
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        self.subnet = random.randint(1, 250)
        self.tag = f"{os.getpid() % 10000}{random.randint(10, 99)}"
        self.bridge, self.gateway = f"dbx{self.tag}", f"10.232.{self.subnet}.1"
        self.version = cgroup_version()
        self.machines: list[Machine] = []
        self._links: list[str] = []
        self._netns: list[str] = []
        self._cgroups: list[Path] = []
        self._proxy: subprocess.Popen[str] | None = None
        atexit.register(self.close)
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for i in range(n):
                self.machines.append(self._machine(i, workdir, memory, rate, cpu_weight))
                self.machines[-1].threads = threads
            if rtt_ms > 0:
                self._start_proxy(rtt_ms)
        except BaseException:
            self.close()
            raise

    def _machine(self, i: int, workdir: Path, memory: int, rate: str, weight: int) -> Machine:
        ns, outer, inner = f"dbx{self.tag}-m{i}", f"dbx{self.tag}{i}a", f"dbx{self.tag}{i}b"
        ip = f"10.232.{self.subnet}.{10 + i}"
        sh("ip", "netns", "add", ns)
        self._netns.append(ns)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        self._links.append(outer)
        sh("ip", "link", "set", inner, "netns", ns)
        sh("ip", "link", "set", outer, "master", self.bridge, "up")
        inside = ["ip", "netns", "exec", ns]
        sh(*inside, "ip", "addr", "add", f"{ip}/24", "dev", inner)
        sh(*inside, "ip", "link", "set", inner, "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        sh(*inside, "ip", "route", "add", "default", "via", self.gateway)
        tbf = ["tbf", "rate", rate, "burst", "1mb", "latency", "50ms"]
        sh("tc", "qdisc", "add", "dev", outer, "root", *tbf)  # into the machine
        sh(*inside, "tc", "qdisc", "add", "dev", inner, "root", *tbf)  # out of it
        name = f"m{i}"
        machine_dir = workdir / name
        (machine_dir / "cache").mkdir(parents=True, exist_ok=True)
        cgroups = self._make_cgroups(f"drift-box-{self.tag}-{name}", memory, weight)
        return Machine(name, ns, ip, None, cgroups, memory, machine_dir)

    def _make_cgroups(self, name: str, memory: int, weight: int) -> list[Path]:
        """[memory cgroup, cpu cgroup] (one directory in v2) for one machine."""
        if self.version == 2:
            d = CG / name  # the root: v2 allows no child beside a cgroup's own processes
            control = CG / "cgroup.subtree_control"
            for ctl in ("+memory", "+cpu"):
                if ctl[1:] not in control.read_text().split():
                    control.write_text(ctl)
            d.mkdir()
            self._cgroups.append(d)
            (d / "memory.max").write_text(str(memory))
            (d / "cpu.weight").write_text(str(weight))
            return [d]
        mem, cpu = own_cgroup("memory") / name, own_cgroup("cpu") / name
        mem.mkdir()
        self._cgroups.append(mem)
        (mem / "memory.limit_in_bytes").write_text(str(memory))
        dirs = [mem]
        if (CG / "cpu").is_dir():
            cpu.mkdir()
            self._cgroups.append(cpu)
            (cpu / "cpu.shares").write_text(str(weight * 1024 // 100))
            dirs.append(cpu)
        return dirs

    def _start_proxy(self, rtt_ms: float) -> None:
        routes = []
        for m in self.machines:
            m.announce = f"{self.gateway}:{free_port(self.gateway)}"
            routes.append(f"{m.announce}={m.ip}:{PORT}")
        self._proxy = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.proxy", "--rtt_ms", str(rtt_ms), *routes],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(Path.cwd())),
        )  # fmt: skip
        assert self._proxy.stdout is not None
        for _ in routes:  # one line per route once it listens
            if not self._proxy.stdout.readline():
                raise RuntimeError("the delaying proxy did not start")

    def close(self) -> None:
        """Kill everything the box started; remove its namespaces, links and cgroups."""
        for m in self.machines:
            m.kill()
        if self._proxy is not None and self._proxy.poll() is None:
            self._proxy.kill()
            self._proxy.wait(timeout=30)
        for link in reversed(self._links):
            sh("ip", "link", "del", link, check=False)
        for ns in self._netns:
            sh("ip", "netns", "del", ns, check=False)
        for d in reversed(self._cgroups):
            for _ in range(50):  # the kernel frees a cgroup shortly after its last process
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self._links, self._netns, self._cgroups = [], [], []
        atexit.unregister(self.close)

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
