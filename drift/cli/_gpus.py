"""`drift up` on a machine with several GPUs: one server per GPU, each its own swarm member.

Each GPU runs its own `drift up` (its device, port and identity, its memory budget read from
that GPU): the first starts or joins the swarm exactly as a one-GPU `drift up` would (the
default identity and port, so its join command is the machine's), the others join it through
the first's join token once it serves, and take the blocks the swarm still lacks. The parent
only supervises: it relays each child's output prefixed `[gpu N]`, hands SIGINT/SIGTERM on
(each child drains as `drift up` does; a second Ctrl+C kills them), and exits with the worst
status. `plan` is pure (the children's command lines); `supervise` runs them. Knows nothing
of models or memory.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from drift.wire.errors import BadRequest

JOIN_RE = re.compile(r"--join (drift://\S+|/\S+)")  # the join command a serving `drift up` prints
_REFUSED = ("--host_maddrs", "--announce_maddrs", "--announce_addr")


def parse_gpus(text: str) -> int | None:
    """--gpus: `all` (None) or a count >= 1."""
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"'all' or a count >= 1, not {text!r}")
    return n


def count_devices(device: str, gpus: int | None) -> tuple[str, int]:
    """(kind, how many servers) `drift up --device DEVICE --gpus GPUS` runs here: one per
    visible CUDA (or XPU) device for `auto` / `cuda` / `xpu` (`gpus`: at most that many;
    None: all); one for an explicit index (`cuda:1`), the CPU or MPS."""
    kind, _, index = device.strip().lower().partition(":")
    if index or kind not in ("auto", "cuda", "xpu"):
        return kind, 1
    import torch

    found = 0
    if kind in ("auto", "cuda") and torch.cuda.is_available():
        kind, found = "cuda", torch.cuda.device_count()
    elif kind in ("auto", "xpu") and hasattr(torch, "xpu") and torch.xpu.is_available():
        kind, found = "xpu", torch.xpu.device_count()
    return kind, max(1, min(found, gpus) if gpus is not None else found)


@dataclass(frozen=True)
class Child:
    device: str  # e.g. cuda:1
    port: int
    argv: list[str]  # drift's arguments (after the program name), `up` first

    @property
    def name(self) -> str:
        return f"gpu {self.device.partition(':')[2]}"


def plan(argv: Sequence[str], n: int, *, kind: str, ports: Sequence[int],
         identity_path: Path | None, cache_dir: Path, private_key: Path | None) -> list[Child]:  # fmt: skip
    """The children's command lines: `argv` as given (so config and flags stay the same) plus
    each one's device, port and identity; child 0 keeps the default identity (or the one
    given), child i > 0 gets `<cache>/identities/gpu-<i>.key` (or `<stem>-gpu<i><suffix>` of
    the one given), stable across restarts. Child 0's join token is added for the others at
    start (`supervise`); a --private swarm's key file goes with them instead of --private."""
    given = [a.split("=", 1)[0] for a in argv]
    refused = [a for a in _REFUSED if a in given]
    if refused:
        raise BadRequest(f"{refused[0]} names one address, and each of this machine's {n} GPUs "
                         "runs its own server: give --port (GPU i listens on PORT + i), or "
                         "--gpus 1 to serve from one GPU only")  # fmt: skip
    if len(ports) != n:
        raise ValueError(f"{n} servers need {n} ports, got {list(ports)}")
    children = []
    for i in range(n):
        args = [*argv, "--gpus", "1", "--device", f"{kind}:{i}", "--port", str(ports[i])]
        if i > 0:
            if identity_path is not None:
                ident = identity_path.with_name(
                    f"{identity_path.stem}-gpu{i}{identity_path.suffix}"
                )
            else:
                ident = cache_dir / "identities" / f"gpu-{i}.key"
            args += ["--identity_path", str(ident)]
            if private_key is not None:
                args = [a for a in args if a != "--private"] + ["--swarm_key_file",
                                                                str(private_key)]  # fmt: skip
        children.append(Child(f"{kind}:{i}", ports[i], args))
    return children


Launch = Callable[[list[str]], "subprocess.Popen[str]"]


def launch(argv: list[str]) -> subprocess.Popen[str]:
    """`python -m drift.cli *argv`, its output (stdout and stderr) to be relayed."""
    # its own session: a terminal's Ctrl+C reaches the parent only, which hands it on once
    return subprocess.Popen([sys.executable, "-m", "drift.cli", *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


class Supervisor:
    """The children of one `drift up`: started, relayed, stopped together."""

    def __init__(self, children: list[Child], *, join: bool, launch: Launch = launch,
                 out: Callable[[str], None] = print) -> None:  # fmt: skip
        """`join`: the others join child 0's token (no --join was given)."""
        self.children, self.join, self._launch, self._out = children, join, launch, out
        self.procs: list[subprocess.Popen[str]] = []
        self._relays: list[threading.Thread] = []
        self._token = threading.Event()
        self.token: str | None = None
        self._stopping = 0  # signals received

    def run(self, first_timeout_s: float | None = None) -> int:
        """Start every child (the others once the first serves, when they join it), wait for
        all to end; the worst exit status (0 when all ended well)."""
        try:
            self._start(self.children[0])
            if len(self.children) > 1 and self.join:
                if not self._wait_token(first_timeout_s):
                    return self._finish()
            for child in self.children[1:]:
                if self._stopping:
                    break
                extra = ["--join", self.token] if self.join and self.token else []
                self._start(child, extra)
            return self._finish()
        except BaseException:
            self.stop(kill=True)
            raise

    def _start(self, child: Child, extra: Sequence[str] = ()) -> None:
        proc = self._launch([*child.argv, *extra])
        self.procs.append(proc)
        relay = threading.Thread(target=self._relay, args=(child, proc), daemon=True)
        relay.start()
        self._relays.append(relay)

    def _relay(self, child: Child, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            found = JOIN_RE.search(line)
            if found and self.token is None:
                self.token = found.group(1)
                self._token.set()
            self._out(f"[{child.name}] {line.rstrip()}")
        if proc is self.procs[0]:
            self._token.set()  # the first ended: nobody waits for its token any more

    def _wait_token(self, timeout_s: float | None) -> bool:
        """Until child 0 printed its join command; False when it ended without."""
        self._token.wait(timeout_s)
        if self.token is None:
            self._out(f"[{self.children[0].name}] ended before serving: the other GPUs are "
                      "not started")  # fmt: skip
            return False
        return True

    def _finish(self) -> int:
        codes = [p.wait() for p in self.procs]
        for relay in self._relays:
            relay.join(timeout=5)
        bad = [c for c in codes if c != 0]
        return max(bad, key=abs) if bad else 0

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM to every child still running (they drain), or SIGKILL."""
        for p in self.procs:
            if p.poll() is None:
                p.kill() if kill else p.send_signal(signal.SIGTERM)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: the children drain; a second one kills them."""
        self._stopping += 1
        self.stop(kill=self._stopping > 1)


def supervise(children: list[Child], *, join: bool) -> int:
    """Run `children` under signal handling (the main thread's); their worst exit status."""
    sup = Supervisor(children, join=join)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, sup.on_signal)
    return sup.run()
