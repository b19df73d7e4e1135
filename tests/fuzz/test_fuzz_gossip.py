"""Fuzzing membership and the swarm-key proof: hostile gossip never breaks the table.

Any JSON body to a node's gossip handler gets a BadRequest or a reply, and afterwards the
table stays within its bounds, holds only records that verify, and keeps the node's real
peers; records of any shape raise only BadRequest; auth headers of any shape raise only
Unauthorized / Forbidden, and a valid proof is accepted once.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from drift.identity import Identity
from drift.node import MembershipNode, NodeConfig
from drift.swarm import PeerRecord, default_fields, sign_record
from drift.wire.auth import ReplayCache, auth_headers, check_request
from drift.wire.errors import BadRequest, DriftError, Forbidden, Unauthorized
from tests.fuzz.strategies import json_values

IDENTITIES = [Identity.generate() for _ in range(4)]


def _record(ident: Identity, fields: dict[str, Any]) -> dict[str, Any]:
    base = default_fields(ident.peer_id, ["http://127.0.0.1:9"], "0.1.0")
    base.update(seq=int(time.time() * 1e6), expires_at=time.time() + 30)
    base.update(fields)
    try:
        return sign_record(ident, base).to_wire()
    except BadRequest:
        return {**base, "signature": "AAAA"}


record_fields = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["server", "dht", "x"]),
        "state": st.sampled_from(["online", "offline", "joining", "??"]),
        "start_block": st.integers(-1, 10) | st.none(),
        "end_block": st.integers(-1, 10) | st.none(),
        "num_blocks": st.integers(0, 10) | st.none(),
        "throughput": st.floats(allow_nan=False) | st.integers(-5, 5),
        "expires_at": st.floats(0, 2e10, allow_nan=False),
        "seq": st.integers(-5, 2**62),
        "addrs": st.lists(st.text(max_size=30), max_size=12),
        "model": st.text(max_size=50) | st.none(),
    },
)
records = st.builds(_record, st.sampled_from(IDENTITIES), record_fields) | json_values


def _node(private: bool = False) -> MembershipNode:
    """A node (not listening); a private one takes records straight into its table, an
    open one queues unknown peers for a dial."""
    config = NodeConfig(max_records=3, max_pending=2, swarm_key="k" if private else None)
    node = MembershipNode(Identity.generate(), config)
    node.bind(1)
    return node


@given(st.lists(records, max_size=40), st.booleans(), st.text(max_size=80) | st.none(),
       st.booleans())  # fmt: skip
@example([_record(IDENTITIES[0], {"expires_at": time.time() + 10 * 365 * 86400})], True, "n", True)
@example([_record(IDENTITIES[1], {"model": "x" * 5000})], True, "n", True)
def test_gossip_bodies_never_break_the_table(items, pull, nonce, private) -> None:
    node = _node(private)
    body = {"peer_id": "x", "records": items, "nonce": nonce, "pull": pull}
    try:
        reply = node.handle_gossip(body)
        assert isinstance(reply["records"], list)
    except DriftError as exc:
        assert isinstance(exc, BadRequest), repr(exc)
    assert len(node.table) <= node.config.max_records
    assert len(node.admission.pending) <= node.config.max_pending
    now = time.time()
    for record in node.table.records():
        assert record.verify()
        assert node.table.deadline(record.peer_id) <= now + node.config.record_ttl_s


@given(json_values)
def test_any_json_gossip_body_is_a_reply_or_a_bad_request(body) -> None:
    try:
        _node().handle_gossip(body)
    except DriftError as exc:
        assert isinstance(exc, BadRequest), repr(exc)


@given(records)
def test_records_of_any_shape_raise_only_bad_request(item) -> None:
    try:
        PeerRecord.from_wire(item)
    except DriftError as exc:
        assert isinstance(exc, BadRequest), repr(exc)


header_text = st.text(max_size=200) | st.builds(
    lambda parts: ",".join(f"{k}={v}" for k, v in parts),
    st.lists(st.tuples(st.sampled_from(["v", "t", "n", "to", "h", "mac", "x"]),
                       st.text(max_size=70)), max_size=8),
)  # fmt: skip


@given(header_text, st.sampled_from(["X-Drift-Auth", "Authorization"]))
def test_auth_headers_of_any_shape_are_401_or_403(value, name) -> None:
    me = IDENTITIES[0].peer_id
    try:
        check_request("k3y", "GET", "/swarm", "", {name: value}, peer_id=me, now=time.time(),
                      max_skew_s=60, replay=ReplayCache(60, 16))  # fmt: skip
    except (Unauthorized, Forbidden):
        return
    assert name == "Authorization" and value.partition(" ")[2].strip() == "k3y"


@given(st.lists(st.sampled_from(["GET", "POST"]), min_size=1, max_size=30))
def test_each_proof_is_accepted_once_and_memory_stays_bounded(methods) -> None:
    me, replay, start = IDENTITIES[0].peer_id, ReplayCache(60, 8), time.time()
    for i, method in enumerate(methods):
        now = start + i * 0.01  # proofs made 10 ms apart
        headers = auth_headers("k3y", method, "/swarm?a=1", peer_id=me, now=now)
        args = ("k3y", method, "/swarm", "a=1", headers)
        check_request(*args, peer_id=me, now=now, max_skew_s=60, replay=replay)
        try:
            check_request(*args, peer_id=me, now=now, max_skew_s=60, replay=replay)
        except Forbidden:
            pass
        else:
            raise AssertionError("a proof was accepted twice")
        assert len(replay) <= 8
