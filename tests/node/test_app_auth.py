"""Node routes and private swarms over real HTTP: errors as JSON, dashboard, swarm key."""

from __future__ import annotations

import hashlib
import time

import aiohttp
import orjson
import pytest

from drift.identity import Identity
from drift.node import auth_headers
from drift.node.auth import AUTH_HEADER, bearer_headers
from drift.wire.errors import Forbidden, Unauthorized
from tests.node.node_helpers import Nodes, live_ids, wait_for


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, object, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        body = await resp.read()
        ctype = resp.headers.get("Content-Type", "")
        return resp.status, (orjson.loads(body) if "json" in ctype else body.decode()), ctype


async def test_health_swarm_coverage_and_json_errors(nodes: Nodes) -> None:
    node, run = await nodes.start()
    base = f"http://127.0.0.1:{run.port}"
    status, body, _ = await get(base + "/health")
    assert status == 200 and body == {"status": "ok", "peer_id": node.peer_id, "version": "0.1.0"}
    status, body, _ = await get(base + "/swarm")
    assert status == 200 and body["peer_id"] == node.peer_id  # type: ignore[index]
    assert [r["peer_id"] for r in body["records"]] == [node.peer_id]  # type: ignore[index]
    status, body, _ = await get(base + "/swarm/coverage")
    assert status == 200 and body["model"] is None and body["blocks"] == []  # type: ignore[index]
    node.announce(
        role="server",
        model="tiny",
        model_fingerprint="abc",
        num_blocks=4,
        start_block=1,
        end_block=3,
        throughput=2.5,
    )
    status, body, _ = await get(base + "/swarm/coverage?model=tiny")
    assert status == 200 and body["missing"] == [0, 3]  # type: ignore[index]
    assert body["blocks"][1] == {"index": 1, "peers": [node.peer_id], "throughput": 2.5}  # type: ignore[index]
    status, body, _ = await get(base + "/swarm/coverage?model=nope")
    assert status == 404 and body["error"]["code"] == "not_found"  # type: ignore[index]
    status, body, _ = await get(base + "/no/such/route")
    assert status == 404 and body == {
        "error": {"code": "not_found", "message": "Not Found: GET /no/such/route"}
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/swarm/gossip", data=b"{not json") as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "bad_request"
        async with http.post(base + "/swarm/gossip", json={"records": "x"}) as resp:
            assert resp.status == 400 and "records" in (await resp.json())["error"]["message"]
        async with http.post(base + "/health") as resp:
            assert (
                resp.status == 405 and (await resp.json())["error"]["code"] == "method_not_allowed"
            )


async def test_unknown_exceptions_are_500_without_traceback(nodes: Nodes) -> None:
    node, run = await nodes.start()

    def boom(data: object) -> dict[str, object]:
        raise RuntimeError("secret internals")

    node.handle_gossip = boom  # type: ignore[method-assign]
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{run.port}/swarm/gossip"
        async with http.post(url, json={"records": []}) as resp:
            text = await resp.text()
            assert resp.status == 500 and "secret" not in text and "Traceback" not in text
            assert orjson.loads(text) == {
                "error": {"code": "internal", "message": "internal server error"}
            }


async def test_dashboard_static_files_and_fallback(nodes: Nodes, tmp_path) -> None:
    web = tmp_path / "web"
    (web / "js").mkdir(parents=True)
    (web / "index.html").write_text("<h1>drift dashboard</h1>")
    (web / "js" / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("nope")
    _, run = await nodes.start(web_dir=web)
    base = f"http://127.0.0.1:{run.port}"
    status, body, ctype = await get(base + "/")
    assert status == 200 and "drift dashboard" in body and "html" in ctype  # type: ignore[operator]
    status, body, _ = await get(base + "/static/js/app.js")
    assert status == 200 and body == "console.log(1)"
    status, body, _ = await get(base + "/static/..%2Fsecret.txt")
    assert status == 404 and body["error"]["code"] == "not_found"  # type: ignore[index]
    node2, run2 = await nodes.start(web_dir=tmp_path / "absent")
    status, body, ctype = await get(f"http://127.0.0.1:{run2.port}/")
    assert status == 200 and "text/plain" in ctype and node2.peer_id in body  # type: ignore[operator]


def test_hmac_headers_check_and_reject() -> None:
    from drift.wire.auth import check_body, check_request

    now, me = time.time(), Identity.generate().peer_id
    body = b'{"records": []}'
    headers = auth_headers("k3y", "POST", "/swarm/gossip?x=1", body, peer_id=me, now=now)

    def check(key="k3y", method="POST", path="/swarm/gossip", query="x=1", hdrs=None, when=now,
              to=me):  # fmt: skip
        return check_request(key, method, path, query, headers if hdrs is None else hdrs,
                             peer_id=to, now=when, max_skew_s=60, replay=None)  # fmt: skip

    proof = check()
    check_body(proof, hashlib.sha256(body).hexdigest())
    with pytest.raises(Forbidden, match="body"):
        check_body(proof, hashlib.sha256(b"{}").hexdigest())  # other body
    for kwargs in [
        {"key": "other"},  # wrong key
        {"method": "GET"},  # other method
        {"path": "/swarm"},  # other path
        {"query": "x=2"},  # other query
        {"query": ""},  # query dropped
        {"when": now + 120},  # stale timestamp
        {"to": Identity.generate().peer_id},  # meant for another node
    ]:
        with pytest.raises(Forbidden):
            check(**kwargs)
    with pytest.raises(Unauthorized):
        check(hdrs={})
    with pytest.raises(Unauthorized):
        check(hdrs={AUTH_HEADER: "garbage"})
    check(method="GET", hdrs=bearer_headers("k3y"))
    with pytest.raises(Forbidden):
        check(method="GET", hdrs=bearer_headers("k3x"))
    assert auth_headers(None, "GET", "/swarm", peer_id=me) == {}


async def test_private_swarm_refuses_callers_without_the_key(nodes: Nodes) -> None:
    seed, run = await nodes.start(swarm_key="s3cret")
    base = f"http://127.0.0.1:{run.port}"
    # open routes stay open
    assert (await get(base + "/health"))[0] == 200
    assert (await get(base + "/"))[0] == 200
    # reading the table: 401 without proof, 403 with the wrong key, 200 with the key
    status, body, _ = await get(base + "/swarm")
    assert status == 401 and body["error"]["code"] == "unauthorized"  # type: ignore[index]
    status, body, _ = await get(base + "/swarm/coverage", bearer_headers("wrong"))
    assert status == 403 and body["error"]["code"] == "forbidden"  # type: ignore[index]
    assert (await get(base + "/swarm", bearer_headers("s3cret")))[0] == 200
    proof = auth_headers("s3cret", "GET", "/swarm", peer_id=seed.peer_id)
    assert (await get(base + "/swarm", proof))[0] == 200

    # joining: a node without the key / with a wrong key cannot; one with it can
    outsider, _ = await nodes.start()
    with pytest.raises(Unauthorized):
        await outsider.join(seed.join_token())
    wrong, _ = await nodes.start(swarm_key="guess")
    with pytest.raises(Forbidden):
        await wrong.join(seed.join_token())
    member, _ = await nodes.start(seed.join_token(), swarm_key="s3cret")
    await wait_for(lambda: member.peer_id in live_ids(seed), 5, "member to join")
    assert seed.peer_id in live_ids(member)
    assert outsider.peer_id not in live_ids(seed) and wrong.peer_id not in live_ids(seed)
    assert seed.peer_id not in live_ids(outsider)
