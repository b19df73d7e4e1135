"""A link that goes down, in a network namespace the test makes and removes (issue 16).

A veth pair joins a fresh namespace to this one on a /30 of 10.231.<n>.0 made for the
test (no other address is touched): the seed and replica B listen on the root side, server
A inside the namespace. A serves alone until the session runs on it, then B joins; the link
to A goes down mid-generation: packets vanish without a reset, so the client leaves A after
a few of its step times and finishes on B with the same tokens; the link comes back up and
A is back in the swarm. Needs root and `ip netns`.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from tests.client.faults import AtStep
from tests.faults.procs import dht, server, wait_online
from tests.tiny_models import save_tiny

pytestmark = [pytest.mark.timeout(600)]
if os.geteuid() != 0 or shutil.which("ip") is None:
    pytest.skip("needs root and iproute2 (ip netns)", allow_module_level=True)


def ip(*args: str, ns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=30)


class Net:
    """A namespace and a veth pair on a /30 of 10.231.<n>.0, removed by `close`."""

    def __init__(self) -> None:
        n = random.randint(1, 250)
        tag = f"{os.getpid() % 10000}{n}"
        self.ns, self.outer, self.inner = f"drift-t{tag}", f"dv{tag}a", f"dv{tag}b"
        self.root_ip, self.ns_ip = f"10.231.{n}.1", f"10.231.{n}.2"
        subprocess.run(["ip", "netns", "add", self.ns], check=True, timeout=30)
        try:
            ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
            ip("link", "set", self.inner, "netns", self.ns)
            ip("addr", "add", f"{self.root_ip}/30", "dev", self.outer)
            ip("link", "set", self.outer, "up")
            ip("addr", "add", f"{self.ns_ip}/30", "dev", self.inner, ns=self.ns)
            ip("link", "set", self.inner, "up", ns=self.ns)
            ip("link", "set", "lo", "up", ns=self.ns)
        except BaseException:
            self.close()
            raise

    def link(self, up: bool) -> None:
        ip("link", "set", self.inner, "up" if up else "down", ns=self.ns)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)


@pytest.fixture
def net() -> Iterator[Net]:
    n = Net()
    try:
        yield n
    finally:
        n.close()


def test_link_down_mid_generation_fails_over_and_comes_back(net: Net, tmp_path: Path) -> None:
    model_dir = save_tiny("llama", tmp_path / "tiny-llama")
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=16, do_sample=False)
    inside = ["ip", "netns", "exec", net.ns]
    seed = dht("seed", tmp_path, host=net.root_ip).start()
    a = server("a", tmp_path, model_dir, 0, 4, seed, host=net.ns_ip, prefix=inside)
    b = server("b", tmp_path, model_dir, 0, 4, seed, host=net.root_ip)
    members = [seed, a, b]
    model = None
    try:
        a.start()
        wait_online(seed.token, {a.peer_id})  # type: ignore[arg-type]
        config = ClientConfig(swarm_refresh_s=0.2, ban_base_s=0.3, ban_max_s=1.0,
                              min_step_timeout_s=1.0, connect_timeout_s=2.0)  # fmt: skip
        model = AutoDistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=str(seed.token), client_config=config
        )
        assert torch.equal(model.generate(ids, max_new_tokens=16, do_sample=False), ref)
        cut: list[float] = []

        def bring_up_the_replica() -> None:  # the session runs on A, the only server yet
            b.start()
            wait_online(seed.token, {a.peer_id, b.peer_id})  # type: ignore[arg-type]

        def cut_the_link() -> None:
            (span,) = model._owned[0].session.spans
            assert span.hop.peer_id == a.peer_id, "the session does not run on A"
            net.link(up=False)
            cut.append(time.monotonic())

        hooks = LogitsProcessorList([AtStep(3, bring_up_the_replica), AtStep(6, cut_the_link)])
        out = model.generate(ids, max_new_tokens=16, do_sample=False, logits_processor=hooks)
        assert cut
        assert torch.equal(out, ref)
        assert model.client.bans.is_banned(a.peer_id)
        wait_online(seed.token, {b.peer_id}, absent={a.peer_id})  # type: ignore[arg-type]
        net.link(up=True)
        wait_online(seed.token, {a.peer_id, b.peer_id})  # type: ignore[arg-type]
    finally:
        if model is not None:
            model.close()
        for m in members:
            m.kill()
