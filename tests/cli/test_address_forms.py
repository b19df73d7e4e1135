"""One transport rule: every node command serves TLS bound to its peer id by default, so every
address form a user writes for a TLS node reaches it, and a form that says plain HTTP (or a
TLS form against a --plain_http node) fails with one line naming the address to write.

The fast tests run in-process nodes and parse each command's flags; the slow one is the
predecessor's literal flow with real processes: `drift dht --identity_path bootstrap.id
--host_maddrs ...`, then `drift server`, `drift up`, `drift status` and the SDK given each
hand-written form of its address."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drift.cli.dht import node_config_from_args
from drift.cli.main import build_parser
from drift.identity.tokens import parse_join_tokens
from drift.swarm.reader import read_swarm, read_swarm_blocking
from drift.wire.errors import PeerUnavailable
from tests.procs import DriftProc
from tests.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]
PEER_RE = r"peer id (\S+) listening on 127\.0\.0\.1:(\d+)"


def forms(peer_id: str, port: int) -> dict[str, tuple[str, bool]]:
    """Every way to write the address of `peer_id` at 127.0.0.1:`port` -> (text, means TLS)."""
    hp, ma = f"127.0.0.1:{port}", f"/ip4/127.0.0.1/tcp/{port}"
    return {
        "drift": (f"drift://{peer_id}@{hp}", True),
        "drift?tls=off": (f"drift://{peer_id}@{hp}?tls=off", False),
        "multiaddr": (f"{ma}/p2p/{peer_id}", True),
        "multiaddr/tls": (f"{ma}/tls/p2p/{peer_id}", True),
        "multiaddr/http": (f"{ma}/http/p2p/{peer_id}", False),
    }


def check_mismatch(message: str, peer_id: str, port: int, node_tls: bool) -> None:
    """One line, no SSL repr, naming the address that works."""
    assert "\n" not in message and "SSLError" not in message and "Connector" not in message
    if node_tls:
        assert "speaks TLS" in message and f"drift://{peer_id}@127.0.0.1:{port} " in message
    else:
        assert "does not speak TLS" in message and "?tls=off" in message
        assert f"/ip4/127.0.0.1/tcp/{port}/http/p2p/{peer_id}" in message


@pytest.mark.parametrize("command", ["dht", "server", "up"])
def test_every_node_command_serves_tls_unless_plain_http(command, caplog):
    parser = build_parser()
    assert node_config_from_args(parser.parse_args([command])).tls is True
    assert node_config_from_args(parser.parse_args([command, "--tls"])).tls is True  # older
    with caplog.at_level(logging.WARNING):
        assert node_config_from_args(parser.parse_args([command, "--plain_http"])).tls is False
    assert "--plain_http" in caplog.text and "?tls=off" in caplog.text


@pytest.mark.parametrize("node_tls", [True, False], ids=["tls-node", "plain-node"])
async def test_every_form_against_a_node(nodes, node_tls, caplog):
    """Each form read from (as drift status and the SDK do) and joined through (as a node
    does): its own scheme works, the other fails with the fix in one line."""
    seed, running = await nodes.start(tls=node_tls)
    for name, (text, tls) in forms(seed.peer_id, running.port).items():
        tokens = parse_join_tokens(text)
        if tls == node_tls:
            snap = await read_swarm(tokens, timeout_s=5)
            assert snap.peer_id == seed.peer_id, name
            continue
        with pytest.raises(PeerUnavailable) as info:
            await read_swarm(tokens, timeout_s=5)
        check_mismatch(info.value.message, seed.peer_id, running.port, node_tls)
    joiners = {}
    for name, (text, _) in forms(seed.peer_id, running.port).items():
        joiners[name], _ = await nodes.start(*parse_join_tokens(text), tls=True)
    expected = {n for n, (_, tls) in forms(seed.peer_id, running.port).items() if tls == node_tls}
    deadline = asyncio.get_running_loop().time() + 10
    while {n for n, j in joiners.items() if j.joined} != expected:
        assert asyncio.get_running_loop().time() < deadline, "joiners did not join"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a few more rounds: the other forms still cannot join
    assert {n for n, j in joiners.items() if j.joined} == expected
    assert "SSLError(" not in caplog.text


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    return dict(env, HOME=str(home), DRIFT_CACHE=str(home / "cache"), OMP_NUM_THREADS="1",
                HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_predecessors_flow_with_every_hand_written_address(tmp_path, drift_procs):
    """`drift dht --identity_path bootstrap.id --host_maddrs ...`; servers join it through a
    hand-written multiaddr and drift:// address, `drift up` through /tls; then `drift status`
    and the SDK (no copy of the model: its parts come from the swarm) with every form, against
    the dht, a server and the up node, all started with their defaults."""
    model = tmp_path / "models" / "acme-tiny"
    save_tiny("llama", model)
    env = _env(tmp_path / "home")

    def start(name: str, *args: str) -> DriftProc:
        proc = DriftProc([*args, "--cache_dir", str(tmp_path / name)], env)
        drift_procs.append(proc)
        return proc

    dht = start("dht", "dht", "--identity_path", str(tmp_path / "bootstrap.id"),
                "--host_maddrs", "/ip4/127.0.0.1/tcp/0")  # fmt: skip
    found = dht.wait_for(PEER_RE, timeout=60)
    dht_id, dht_port = found.group(1), int(found.group(2))
    seed = forms(dht_id, dht_port)
    node_args = ["--host", "127.0.0.1", "--port", "0", "--device", "cpu", "--torch_dtype",
                 "float32", "--throughput", "100", "--gossip_interval", "0.5"]  # fmt: skip
    a = start("a", "server", str(model), "--block_indices", "0:2", *node_args,
              "--initial_peers", seed["multiaddr"][0])  # fmt: skip
    b = start("b", "server", str(model), "--block_indices", "2:4", *node_args,
              "--initial_peers", seed["drift"][0])  # fmt: skip
    up = start("up", "up", str(model), "--block_indices", "0:4", "--start_delay", "0",
               "--balance_quality", "0", *node_args, "--join", seed["multiaddr/tls"][0])  # fmt: skip
    found = a.wait_for(PEER_RE, timeout=240)
    token = parse_join_tokens(up.wait_for(r"--join (drift://\S+)", 240).group(1))[0]
    nodes = {"dht": (dht_id, dht_port), "server": (found.group(1), int(found.group(2))),
             "up": (token.peer_id, token.port)}  # fmt: skip
    b.wait_for(PEER_RE, timeout=240)
    wait_servers(seed["drift"][0], 3)

    for peer_id, port in nodes.values():  # the SDK's and drift status's reader
        for text, tls in forms(peer_id, port).values():
            if tls:
                assert read_swarm_blocking(parse_join_tokens(text)).peer_id == peer_id
            else:
                with pytest.raises(PeerUnavailable) as info:
                    read_swarm_blocking(parse_join_tokens(text))
                check_mismatch(info.value.message, peer_id, port, True)

    for name, (text, tls) in seed.items():  # drift status, as a user types it
        out = subprocess.run([sys.executable, "-m", "drift.cli", "status", "--initial_peers",
                              text], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        if tls:
            assert out.returncode == 0 and "all 4 blocks covered" in out.stdout, (name, out)
        else:
            assert out.returncode == 1, (name, out)
            (line,) = out.stderr.strip().splitlines()
            check_mismatch(line, dht_id, dht_port, True)

    from transformers import AutoModelForCausalLM

    from drift.client import AutoDistributedModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 77, 3]])
    ref = local.generate(ids, max_new_tokens=6, do_sample=False)
    for name, (text, tls) in seed.items():  # the SDK, by the name the swarm announces
        cache = tmp_path / f"client-{name.replace('/', '-').replace('?', '-')}"
        if not tls:
            with pytest.raises(PeerUnavailable, match="speaks TLS"):
                AutoDistributedModelForCausalLM.from_pretrained(
                    "acme-tiny", initial_peers=text, cache_dir=cache
                )
            continue
        with AutoDistributedModelForCausalLM.from_pretrained(
            "acme-tiny", initial_peers=text, cache_dir=cache
        ) as dist:
            assert torch.equal(dist.generate(ids, max_new_tokens=6, do_sample=False), ref), name
        shutil.rmtree(cache)


def wait_servers(token: str, count: int, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        snap = read_swarm_blocking(parse_join_tokens(token))
        if sum(r.state == "online" and r.span is not None for r in snap.live()) >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the dht lists {[r.peer_id for r in snap.live()]}")
        time.sleep(0.3)
