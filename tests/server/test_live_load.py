"""Live load: a server counts steps and tokens (/metrics), announces steps/s and tokens/s in
its signed record (optional fields older peers may lack), and a node measures its gossip
round trip to each peer (/swarm's latency_ms). What the dashboard charts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import torch

from drift.identity import Identity
from drift.node import MembershipNode, NodeConfig
from drift.server.metrics import RateMeter
from drift.swarm import PeerRecord, default_fields, sign_record
from drift.wire.errors import BadRequest
from tests.server.harness import start_block_server
from tests.server.wsclient import RawSession


def test_rate_meter_over_a_sliding_window() -> None:
    now = [0.0]
    meter = RateMeter(window_s=5.0, clock=lambda: now[0])
    assert meter.rates(steps=0, tokens=0) == {"steps_per_s": 0.0, "tokens_per_s": 0.0}
    for second in range(1, 11):  # 2 steps and 20 tokens a second
        now[0] = float(second)
        rates = meter.rates(steps=2 * second, tokens=20 * second)
    assert rates == {"steps_per_s": 2.0, "tokens_per_s": 20.0}
    for second in range(11, 17):  # idle: the window empties
        now[0] = float(second)
        rates = meter.rates(steps=20, tokens=200)
    assert rates == {"steps_per_s": 0.0, "tokens_per_s": 0.0}


def test_optional_load_fields_are_signed_and_optional() -> None:
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:1"], "0.1.0")
    old = sign_record(ident, dict(fields))  # an older peer: no load fields
    assert old.verify() and old.optional("tokens_per_s") is None
    assert "tokens_per_s" not in old.to_wire()
    new = sign_record(ident, {**fields, "steps_per_s": 1.5, "tokens_per_s": 12.0})
    again = PeerRecord.from_wire(new.to_wire())
    assert again.verify() and again.optional("tokens_per_s") == 12.0
    assert again.canonical() == new.canonical()
    with pytest.raises(BadRequest, match="tokens_per_s"):
        PeerRecord.from_wire({**new.to_wire(), "tokens_per_s": -1})
    with pytest.raises(BadRequest, match="unknown record fields"):
        sign_record(ident, {**fields, "made_up": 1})


def test_swarm_payload_names_latency_of_known_peers() -> None:
    node = MembershipNode(Identity.generate(), NodeConfig(host="127.0.0.1", port=0))
    node.bind(1)
    node.note_latency(node.peer_id, 10.0)
    node.note_latency(node.peer_id, 20.0)
    node.note_latency("12D3KooWnotInTheTable", 5.0)
    payload = node.swarm_payload()
    assert payload["latency_ms"] == {node.peer_id: 13.0}  # moving average, known peers only


async def wait_until(check, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_server_announces_its_load_and_node_measures_latency(tiny_llama: Path) -> None:
    a = await start_block_server(tiny_llama, 0, 1)
    b = await start_block_server(tiny_llama, 1, 2, initial_peers=(a.node.join_token(),))
    try:
        hidden = a.server.backend.hidden_size
        async with aiohttp.ClientSession() as http:
            session = await RawSession.open(http, a.url, a.server.backend.model_name, 0, 1,
                                            max_length=16, batch_size=2)  # fmt: skip
            assert isinstance(session, RawSession), session
            for pos in range(4):  # 4 steps of 2 x 3 tokens
                await session.step(torch.randn(2, 3, hidden), pos * 3)
            await session.close()
            async with http.get(f"{a.url}/metrics") as resp:
                text = await resp.text()
            assert "drift_steps_total 4" in text and "drift_tokens_total 24" in text
            assert a.server.metrics.block_tokens_total == 24  # a's span is one block

            async def announced() -> bool:
                rec = a.node.record
                return rec is not None and (rec.optional("tokens_per_s") or 0) > 0

            await wait_until(announced, "a's record to announce tokens/s")

            async def b_sees_load_and_latency() -> bool:
                async with http.get(f"{b.url}/swarm") as resp:
                    body = await resp.json()
                rec = next(r for r in body["records"] if r["peer_id"] == a.node.peer_id)
                return (
                    rec.get("tokens_per_s", 0) > 0 and body["latency_ms"].get(a.node.peer_id, 0) > 0
                )

            await wait_until(b_sees_load_and_latency, "b's /swarm to show a's load and latency")
    finally:
        await b.stop()
        await a.stop()
