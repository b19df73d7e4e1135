"""Join tokens and multiaddrs: round trips in every form, and clear errors for bad ones."""

from __future__ import annotations

import pytest

from drift.identity import (
    Identity,
    JoinToken,
    parse_join_token,
    parse_join_tokens,
    parse_listen_maddr,
)
from drift.wire.errors import BadRequest

PID = Identity.generate().peer_id


@pytest.mark.parametrize(
    ("host", "kind"),
    [("127.0.0.1", "ip4"), ("::1", "ip6"), ("fe80::1:2", "ip6"), ("node-1.example.com", "dns")],
)
def test_round_trip_drift_and_multiaddr(host: str, kind: str) -> None:
    token = JoinToken(PID, host, 31337)
    text = token.to_drift()
    if kind == "ip6":
        assert f"@[{host}]:31337" in text
    assert parse_join_token(text) == token
    maddr = token.to_multiaddr()
    assert maddr == f"/{kind}/{host}/tcp/31337/p2p/{PID}"
    assert parse_join_token(maddr) == token


def test_swarm_key_in_query_round_trips_with_odd_characters() -> None:
    token = JoinToken(PID, "10.0.0.2", 8080, "s3cr+t/&=key")
    text = token.to_drift()
    assert "?key=" in text and "&" not in text.split("?", 1)[1]
    assert parse_join_token(text) == token
    assert token.to_drift(with_key=False) == f"drift://{PID}@10.0.0.2:8080"


def test_url_and_lists() -> None:
    assert JoinToken(PID, "::1", 5).url == "https://[::1]:5"
    assert JoinToken(PID, "::1", 5, tls=False).url == "http://[::1]:5"
    tokens = parse_join_tokens(f"drift://{PID}@a.b:1, /ip4/1.2.3.4/tcp/2/p2p/{PID},")
    assert [(t.host, t.port) for t in tokens] == [("a.b", 1), ("1.2.3.4", 2)]
    assert parse_join_token(f"/dns4/a.b/tcp/3/p2p/{PID}").host == "a.b"


def test_plain_http_is_said_in_both_forms() -> None:
    """TLS is the default; a plain node's token says tls=off (multiaddr: /http)."""
    plain = JoinToken(PID, "10.0.0.2", 8080, "k&y", tls=False)
    assert plain.to_drift().endswith("&tls=off") and parse_join_token(plain.to_drift()) == plain
    assert plain.to_drift(with_key=False) == f"drift://{PID}@10.0.0.2:8080?tls=off"
    assert plain.to_multiaddr() == f"/ip4/10.0.0.2/tcp/8080/http/p2p/{PID}"
    assert parse_join_token(plain.to_multiaddr()) == JoinToken(PID, "10.0.0.2", 8080, tls=False)
    assert parse_join_token(f"/ip4/10.0.0.2/tcp/8080/tls/p2p/{PID}").tls
    assert parse_join_token(f"drift://{PID}@10.0.0.2:8080?tls=on").tls
    with pytest.raises(BadRequest, match="tls="):
        parse_join_token(f"drift://{PID}@10.0.0.2:8080?tls=maybe")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("127.0.0.1:31337", "neither"),
        (f"drift://{PID}127.0.0.1:31337", "peer_id"),
        (f"drift://{PID}@127.0.0.1", "host"),
        (f"drift://{PID}@127.0.0.1:0", "port"),
        (f"drift://{PID}@127.0.0.1:70000", "port"),
        (f"drift://{PID}@::1:31337", "brackets"),
        (f"drift://{PID}@[1.2.3.4]:5", "IPv6"),
        (f"drift://{PID}@host_name:5", "DNS"),
        ("drift://12D3KooWnope@1.2.3.4:5", "peer id"),
        (f"drift://{PID}@1.2.3.4:5?other=1", "query"),
        (f"drift://{PID}@1.2.3.4:5?key=", "key"),
        (f"/ip4/::1/tcp/5/p2p/{PID}", "ip4"),
        (f"/ip6/1.2.3.4/tcp/5/p2p/{PID}", "ip6"),
        (f"/ip4/1.2.3.4/udp/5/p2p/{PID}", "tcp"),
        ("/ip4/1.2.3.4/tcp/5", "parts"),
        (f"/ip4/1.2.3.4/tcp/5/p3p/{PID}", "p2p"),
    ],
)
def test_bad_tokens_show_expected_form(text: str, why: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_join_token(text)
    assert why.lower() in info.value.message.lower()
    assert "drift://<peer_id>@<host>:<port>" in info.value.message


def test_listen_maddr() -> None:
    assert parse_listen_maddr("/ip4/0.0.0.0/tcp/31337") == ("0.0.0.0", 31337)
    assert parse_listen_maddr("/ip6/::/tcp/0") == ("::", 0)
    with pytest.raises(BadRequest):
        parse_listen_maddr("0.0.0.0:31337")
