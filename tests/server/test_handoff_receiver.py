"""A server takes a handed-over session (issue 28) only from a live member of its swarm, made
out to it, fresh, once, and within its KV budget: each refusal is a clear error on the
/handoff socket, and the receiver keeps serving with nothing reserved.

Two real in-process servers of a tiny llama on loopback: the sender's real session (a few
steps in) is snapshotted as a drain would (`_snapshot`) and offered to the receiver, first
validly (taken, and the session steps on there exactly), then forged every other way.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from dataclasses import replace

import aiohttp
import orjson
import torch

from drift.identity import Identity
from drift.server.handoff import HANDOFF_PATH, _snapshot, sign_offer
from drift.server.handoff_hub import PARK_TIMEOUT_S
from drift.wire.frames import encode_frame
from drift.wire.handoff import HandoffOffer, ResumeSession
from tests.server.wsclient import RawSession
from tests.tiny_models import TinyDirs

H = 64


def _forged(ident: Identity, offer: HandoffOffer, target: str, **changes) -> HandoffOffer:
    """`offer` made out to `target` and signed by `ident` (with `changes`)."""
    fields = dict(sender=ident.peer_id, target=target, nonce=secrets.token_hex(16),
                  issued_at=time.time())  # fmt: skip
    offer = replace(offer, **(fields | changes))
    signature = base64.b64encode(ident.sign(offer.signed_bytes())).decode("ascii")
    return replace(offer, signature=signature)


async def _offer(http: aiohttp.ClientSession, url: str, offer: HandoffOffer,
                 pieces: list) -> dict:  # fmt: skip
    """The receiver's last word on `offer`: handoff_accepted, or its error message."""
    async with http.ws_connect(f"{url}{HANDOFF_PATH}") as ws:
        await ws.send_str(orjson.dumps(offer.to_wire()).decode())
        reply = orjson.loads((await ws.receive(timeout=20)).data)
        if reply.get("type") != "handoff_ready":
            return reply
        for piece in pieces:
            await ws.send_bytes(encode_frame(*piece.to_wire()))
        return orjson.loads((await ws.receive(timeout=20)).data)


async def _active(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/blocks") as resp:
        assert resp.status == 200
        return int((await resp.json())["active_sessions"])


async def test_only_a_fresh_signed_offer_of_a_member_within_budget_is_taken(
    tmp_path_factory, swarms
) -> None:
    model_dir = TinyDirs(tmp_path_factory.mktemp("tiny_handoff_rx"))("llama")
    swarm = await swarms.start(model_dir, [(0, 4), (0, 4)], attn_cache_tokens=256)
    sender, receiver = swarm.servers
    fp, target = sender.server.backend.fingerprint, receiver.node.peer_id
    hidden = torch.randn(1, 6, H)
    async with aiohttp.ClientSession() as http:
        raw = await RawSession.open(http, sender.url, fp, 0, 4, max_length=32)
        assert isinstance(raw, RawSession), raw
        await raw.step(hidden[:, :5], 0)
        live = next(iter(sender.server.sessions.sessions.values()))
        offer, pieces = await sender.server.backend.run(_snapshot, live, sender.node.peer_id)
        idle = await _active(http, receiver.url)

        refusals = {
            "not a live member": _forged(Identity.generate(), offer, target),
            "signature is not": replace(
                _forged(Identity.generate(), offer, target), sender=sender.node.peer_id
            ),
            f"is for {sender.node.peer_id}": sign_offer(
                sender.node, offer, sender.node.peer_id
            ),  # fmt: skip
            "stale": _forged(sender.node.identity, offer, target, issued_at=time.time() - 600),
            # more than its KV budget (256 tokens per block) holds
            "cache_full": _forged(sender.node.identity, offer, target, max_length=300),
        }
        for expected, bad in refusals.items():
            reply = await _offer(http, receiver.url, bad, pieces)
            assert reply.get("type") == "error", (expected, reply)
            assert expected in reply["message"] or expected == reply["code"], (expected, reply)
            assert await _active(http, receiver.url) == idle  # nothing left reserved

        good = sign_offer(sender.node, offer, target)
        accepted = await _offer(http, receiver.url, good, pieces)
        assert accepted.get("type") == "handoff_accepted", accepted
        replayed = await _offer(http, receiver.url, good, pieces)
        assert replayed["type"] == "error" and "already used" in replayed["message"], replayed
        assert await _active(http, receiver.url) == idle + 1  # the one it took

        # the session it took steps on exactly where the sender's would
        expected = sender.server.backend.span.forward(hidden)[:, -1:]
        async with http.ws_connect(f"{receiver.url}/inference") as ws:
            await ws.send_json(ResumeSession(accepted["session_id"], accepted["token"]).to_wire())
            opened = await ws.receive_json(timeout=20)
            assert opened["type"] == "session_opened", opened
            moved = RawSession(ws)
            moved.step_id = 1
            out = await moved.step(hidden[:, 5:], 5)
        assert torch.allclose(out, expected, atol=1e-5)

        # a session handed over that no client resumes (its client left) is not held for
        # the whole session timeout: closed once PARK_TIMEOUT_S have passed
        orphan = await _offer(http, receiver.url, sign_offer(sender.node, offer, target), pieces)
        assert orphan.get("type") == "handoff_accepted", orphan
        hub = receiver.server.handoff
        assert hub.unclaimed(time.monotonic()) == []
        assert hub.unclaimed(time.monotonic() + PARK_TIMEOUT_S + 1) == [orphan["session_id"]]
        held = await _active(http, receiver.url)
        hub.parked_at[orphan["session_id"]] -= PARK_TIMEOUT_S + 1  # as if a minute went by
        deadline = time.monotonic() + 10
        while orphan["session_id"] in receiver.server.sessions.sessions:
            assert time.monotonic() < deadline, "the unclaimed session was never closed"
            await asyncio.sleep(0.1)
        assert orphan["session_id"] not in hub.parked
        assert await _active(http, receiver.url) == held - 1
        await raw.close()
