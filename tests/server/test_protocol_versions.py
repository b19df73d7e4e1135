"""Rolling upgrades (issue 28): peers of two adjacent wire versions interoperate, two major
versions refuse each other with a clear message.

A record says which wire protocol its peer speaks (`protocol`, "major.minor"). A newer minor
version may add record fields and message fields: an older peer keeps the record (its
signature still verifies when forwarded) and routes to it, and a real server takes messages
of that version with fields it does not know. Another major version: a real server refuses
its messages (version_mismatch, naming both), and clients do not route to such a peer; when
only such peers serve some blocks, the error names the versions.
"""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
import torch

from drift import PROTOCOL_VERSION
from drift.identity import Identity
from drift.swarm import PeerRecord, canonical_bytes, default_fields
from drift.wire import messages as m
from drift.wire.errors import BadRequest, MissingBlocks
from drift.wire.frames import MEDIA_TYPE, decode_frame, encode_frame
from drift.wire.version import same_major
from tests.server.harness import tokens_total
from tests.server.wsclient import RawSession
from tests.tiny_models import TinyDirs

MAJOR = int(PROTOCOL_VERSION.split(".")[0])
NEWER_MINOR = f"{MAJOR}.{int(PROTOCOL_VERSION.split('.')[1]) + 1}"
NEXT_MAJOR = f"{MAJOR + 1}.0"


def signed(protocol: str | None, **more: object) -> dict:
    """A serving record of a fresh identity speaking `protocol` (None: a peer that predates
    the field), with `more` fields (a newer version's), signed by hand as that peer would."""
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:9"], "0.2.0")
    fields.pop("protocol")
    if protocol is not None:
        fields["protocol"] = protocol
    fields.update(role="server", model="tiny", model_fingerprint="f00d", num_blocks=4,
                  start_block=0, end_block=4, seq=1, expires_at=2e9, **more)  # fmt: skip
    sig = base64.b64encode(ident.sign(canonical_bytes(fields))).decode()
    return {**fields, "signature": sig}


def test_versions_of_one_major_interoperate() -> None:
    assert same_major(NEWER_MINOR) and same_major(PROTOCOL_VERSION)
    assert not same_major(NEXT_MAJOR) and not same_major(f"{MAJOR - 1}.9")


def test_own_records_say_the_protocol() -> None:
    fields = default_fields(Identity.generate().peer_id, [], "0.1.0")
    assert fields["protocol"] == PROTOCOL_VERSION


def test_a_newer_minor_peers_record_is_kept_byte_exact_and_serves() -> None:
    wire = signed(NEWER_MINOR, future_load=3, future_mode="fast")
    rec = PeerRecord.from_wire(wire)
    assert rec.verify() and rec.to_wire() == wire  # forwarded as signed
    assert rec.protocol == NEWER_MINOR and rec.speaks_our_protocol() and rec.serves(0)


def test_a_peer_that_predates_the_field_serves() -> None:
    rec = PeerRecord.from_wire(signed(None))
    assert rec.verify() and rec.protocol is None and rec.serves(0)


def test_another_major_version_is_kept_but_serves_nothing() -> None:
    rec = PeerRecord.from_wire(signed(NEXT_MAJOR))
    assert rec.verify() and rec.state == "online"
    assert not rec.speaks_our_protocol() and not any(rec.serves(b) for b in range(4))


@pytest.mark.parametrize("bad", ["2", "two.0", "1.0.0", 1.0, "1." + "0" * 9])
def test_a_malformed_protocol_is_refused(bad: object) -> None:
    with pytest.raises(BadRequest, match="protocol"):
        PeerRecord.from_wire(signed(bad))  # type: ignore[arg-type]


def _frame(fp: str, hidden: torch.Tensor, version: str, **more: object) -> bytes:
    """A /forward frame as a peer of `version` sends it (with fields this one may not know)."""
    params, tensors = decode_frame(m.encode(m.ForwardRequest(fp, 0, 2, hidden)))
    return encode_frame({**params, "version": version, **more}, tensors)


async def _open(http: aiohttp.ClientSession, url: str, fp: str, version: str) -> dict:
    async with http.ws_connect(f"{url}/inference") as ws:
        wire = m.OpenSession(fp, 0, 2, 16, 1, "float32").to_wire()
        await ws.send_json({**wire, "version": version, "future_field": 1})
        return await ws.receive_json(timeout=20)


async def test_a_server_takes_a_newer_minor_and_refuses_another_major(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    fp, url = running.server.backend.fingerprint, running.url
    hidden = torch.randn(1, 3, running.server.backend.hidden_size)
    expected = running.server.backend.span.forward(hidden)
    headers = {"Content-Type": MEDIA_TYPE}
    async with aiohttp.ClientSession() as http:
        body = _frame(fp, hidden, NEWER_MINOR, future_option="on")
        async with http.post(f"{url}/forward", data=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            reply = m.decode(m.ForwardResponse, await resp.read())
        assert torch.allclose(reply.hidden_states, expected, atol=1e-5)
        async with http.post(f"{url}/forward", data=_frame(fp, hidden, NEXT_MAJOR),
                             headers=headers) as resp:  # fmt: skip
            assert resp.status == 400
            err = (await resp.json())["error"]
        assert err["code"] == "version_mismatch"
        assert NEXT_MAJOR in err["message"] and PROTOCOL_VERSION in err["message"]
        assert "upgrade" in err["message"]

        opened = await _open(http, url, fp, NEWER_MINOR)
        assert opened["type"] == "session_opened", opened
        refused = await _open(http, url, fp, NEXT_MAJOR)
        assert refused["type"] == "error" and refused["code"] == "version_mismatch", refused
        # and it still serves this version
        session = await RawSession.open(http, url, fp, 0, 2, max_length=16)
        assert isinstance(session, RawSession), session
        out = await session.step(hidden, 0)
        await session.close()
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> TinyDirs:
    return TinyDirs(tmp_path_factory.mktemp("tiny_versions"))


async def test_clients_route_around_another_major_and_say_so(tiny_dirs, swarms, sdk_models):
    """A server announcing the next major version (as a half-done upgrade would) is not routed
    to; with only it covering blocks 2-3 the error names the versions; a server of this
    version for those blocks makes generation work again, tokens unchanged."""
    from tests.server.reference import load_reference

    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[5, 3, 5, 8, 9]])
    ref = load_reference(model_dir).generate(ids, max_new_tokens=4, do_sample=False)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    upgraded = swarm.servers[1]
    upgraded.node.announce(protocol=NEXT_MAJOR)
    await _until_seed_sees(swarm.seed, upgraded.node.peer_id, NEXT_MAJOR)
    model = await sdk_models.open(model_dir, swarm.token)
    with pytest.raises(MissingBlocks) as info:
        await asyncio.to_thread(model.generate, ids, max_new_tokens=4, do_sample=False)
    msg = info.value.message
    assert "blocks 2-3" in msg and NEXT_MAJOR in msg and PROTOCOL_VERSION in msg, msg
    current = await swarm.add_server(2, 4)
    await _until_client_sees(model, current.node.peer_id)
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    assert await tokens_total(upgraded.url) == 0, "a client stepped on a server of another major"
    assert await tokens_total(current.url) > 0


async def _until_client_sees(model, peer_id: str, timeout_s: float = 20) -> None:
    """Until the client's own view of the swarm lists `peer_id` as a server it may use."""
    client = model.client
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        await asyncio.to_thread(client.run, client.swarm.refresh(force=True))
        if any(s.peer_id == peer_id for s in client.swarm.servers(client.model_fingerprint)):
            return
        assert asyncio.get_running_loop().time() < deadline, "the client never saw the server"
        await asyncio.sleep(0.1)


async def _until_seed_sees(seed, peer_id: str, protocol: str, timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not any(r.peer_id == peer_id and r.protocol == protocol
                  for r in seed.node.live_records()):  # fmt: skip
        assert asyncio.get_running_loop().time() < deadline, "the seed never saw the upgrade"
        await asyncio.sleep(0.05)
