"""`drift up` on a machine with several GPUs: one server per GPU (own device, port, identity;
the others join the first), planned from fakes of the device count, and supervised with real
child processes standing in for `drift up` (no GPU here)."""

from __future__ import annotations

import argparse
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from drift.cli import up
from drift.cli._gpus import Child, Supervisor, count_devices, parse_gpus, plan
from drift.cli.main import build_parser
from drift.wire.errors import BadRequest


def test_gpus_flag() -> None:
    assert parse_gpus("all") is None and parse_gpus("ALL") is None and parse_gpus("3") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(argparse.ArgumentTypeError, match="'all' or a count"):
            parse_gpus(bad)
    assert build_parser().parse_args(["up", "m", "--gpus", "2"]).gpus == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "m", "--gpus", "0"])


def test_count_devices_from_a_faked_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert count_devices("auto", None) == ("cuda", 4)
    assert count_devices("cuda", None) == ("cuda", 4)
    assert count_devices("auto", 2) == ("cuda", 2)
    assert count_devices("auto", 9) == ("cuda", 4)
    assert count_devices("cuda:1", None) == ("cuda", 1)  # pinned: one server
    assert count_devices("cpu", None) == ("cpu", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert count_devices("auto", None)[1] == 1  # this machine: no GPU, one server


def test_plan_gives_each_gpu_its_device_port_and_identity(tmp_path: Path) -> None:
    argv = ["up", "smollm2", "--torch_dtype", "bfloat16"]
    kids = plan(argv, 3, kind="cuda", ports=[31337, 31338, 31339], identity_path=None,
                cache_dir=tmp_path, private_key=None)  # fmt: skip
    assert [k.device for k in kids] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [k.name for k in kids] == ["gpu 0", "gpu 1", "gpu 2"]
    for k in kids:
        args = build_parser().parse_args(k.argv)  # what the child will parse
        assert (args.device, args.port, args.gpus, args.torch_dtype) == (k.device, k.port, 1,
                                                                         "bfloat16")  # fmt: skip
    # the first is the machine's usual node (default identity); the others have stable ones
    assert build_parser().parse_args(kids[0].argv).identity_path is None
    assert [build_parser().parse_args(k.argv).identity_path for k in kids[1:]] == [
        str(tmp_path / "identities" / "gpu-1.key"),
        str(tmp_path / "identities" / "gpu-2.key"),
    ]
    given = plan(argv, 2, kind="cuda", ports=[1, 2], identity_path=tmp_path / "me.key",
                 cache_dir=tmp_path, private_key=None)  # fmt: skip
    assert build_parser().parse_args(given[1].argv).identity_path == str(tmp_path / "me-gpu1.key")


def test_a_private_swarm_gives_the_others_its_key(tmp_path: Path) -> None:
    key = tmp_path / "swarm.key"
    kids = plan(["up", "m", "--private"], 2, kind="cuda", ports=[1, 2], identity_path=None,
                cache_dir=tmp_path, private_key=key)  # fmt: skip
    first, other = (build_parser().parse_args(k.argv) for k in kids)
    assert first.private and not other.private and other.swarm_key_file == str(key)


def test_one_announced_address_for_several_servers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="give --port"):
        plan(["up", "m", "--host_maddrs", "/ip4/0.0.0.0/tcp/4000"], 2, kind="cuda",
             ports=[1, 2], identity_path=None, cache_dir=tmp_path, private_key=None)  # fmt: skip


def test_drift_up_plans_one_server_per_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`drift up` itself, with 3 faked GPUs: three children on free ports from 31337's on."""
    seen: dict = {}
    monkeypatch.setattr(up, "count_devices", lambda device, gpus: ("cuda", 3))
    monkeypatch.setattr(up, "supervise", lambda kids, join: seen.update(kids=kids, join=join) or 0)
    argv = ["up", "smollm2", "--cache_dir", str(tmp_path)]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert up.run(args) == 0
    ports = [k.port for k in seen["kids"]]
    assert len(set(ports)) == 3 and ports == sorted(ports) and ports[0] >= 31337
    assert seen["join"] is True  # no --join given: the others join the first
    argv += ["--join", "drift://12D3KooWAUaYwcJqpNiVAdB9VbPtXbbFEiPCArVMXscpPvqbKyMM@127.0.0.1:9"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert up.run(args) == 0 and seen["join"] is False  # every GPU joins the swarm given


# A stand-in for `drift up`: prints its argv, the join command when it "serves" (unless told
# to fail first), and ends with status 0 on SIGTERM.
FAKE_UP = textwrap.dedent("""
    import signal, sys, time
    argv = sys.argv[1:]
    print("argv", " ".join(argv), flush=True)
    if "--fail" in argv:
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(0.2)
    print("  drift up m --join drift://12D3KooWfake@127.0.0.1:" + argv[argv.index("--port") + 1],
          flush=True)
    time.sleep(60)
""")


def fake_launch(argv: list[str]):
    import subprocess

    return subprocess.Popen([sys.executable, "-c", FAKE_UP, *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def children(n: int, extra: tuple[str, ...] = ()) -> list[Child]:
    return [Child(f"cuda:{i}", 5000 + i, ["up", "m", "--port", str(5000 + i),
                                          *(extra if i == 0 else ())]) for i in range(n)]  # fmt: skip


def test_the_others_join_the_first_and_stop_together() -> None:
    lines: list[str] = []
    sup = Supervisor(children(3), join=True, launch=fake_launch, out=lines.append)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(sup.run(first_timeout_s=60)))
    runner.start()
    deadline = time.monotonic() + 60
    while sum("--join" in line for line in lines) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    sup.on_signal(15, None)  # SIGTERM (or Ctrl+C) to the parent: every child drains
    runner.join(60)
    assert result == [0]
    token = "drift://12D3KooWfake@127.0.0.1:5000"
    assert sup.token == token
    for i in (1, 2):  # the others were started with the first's token, each output prefixed
        assert any(line.startswith(f"[gpu {i}] argv ") and line.endswith(f"--join {token}")
                   for line in lines), lines  # fmt: skip
    assert all(p.poll() is not None for p in sup.procs)


def test_a_first_server_that_fails_starts_no_other() -> None:
    lines: list[str] = []
    sup = Supervisor(children(2, ("--fail",)), join=True, launch=fake_launch, out=lines.append)
    assert sup.run(first_timeout_s=60) == 3
    assert len(sup.procs) == 1
    assert any("ended before serving" in line for line in lines), lines
