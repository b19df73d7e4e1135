"""The attacks of `scripts/soak.py --chaos`: issue 24's red-team findings, mixed into the soak.

Every round the attacker, from its own client address (127.0.0.2, so fair shares count it apart
from `drift api`), tries each of these against the running swarm and API:
- gossip flood: 300 validly self-signed records of fresh identities, claiming every block;
- steered addresses: fresh identities announcing an attacker listener, with a path and query
  (`/internal/admin?op=wipe`) and as a second address; the listener counts what it is sent;
- huge bodies: one past the server's `--max_body_mb` and 2 MiB of junk, to /forward;
- forged pushes: a step for a session that is not there, and one naming a made-up push token;
- KV hog: sessions of `inference_max_length` tokens from one address until refused;
- a long stateless /forward (2,048 tokens) beside the chat load (the batcher wedge's trigger);
- the API (with a valid key): four 7 MiB chat bodies at once, a json_schema 500 levels deep,
  3,000 tools, a cross-origin text/plain POST.
A prober on its own thread times GET /health on every server and on the API every 50 ms; the
worst latency per target is what a stalled event loop would show.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import orjson
import torch
from aiohttp import web

from drift.identity import Identity
from drift.node.gossip import new_nonce
from drift.swarm import canonical_bytes, default_fields
from drift.wire import messages as m
from drift.wire.frames import MEDIA_TYPE, encode_frame

ATTACKER = "127.0.0.2"  # the attacker's own client address (all of 127/8 is loopback)
LISTENER = "127.0.0.3"  # where steered pushes would land
TEN_YEARS = 10 * 365 * 86400.0


@dataclass
class Target:
    """What the attacker is pointed at."""

    seed_url: str
    server_urls: list[str]  # https, self-signed (the attacker does not verify)
    api_url: str
    api_key: str
    fingerprint: str
    hidden_size: int
    num_blocks: int
    max_length: int = 2048  # the servers' inference_max_length
    max_body_mb: float = 64.0  # the servers' --max_body_mb


@dataclass
class Findings:
    """What every attack got back, the worst /health latencies, what the listener was sent."""

    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    worst_health_ms: dict[str, float] = field(default_factory=dict)
    health_failures: Counter[str] = field(default_factory=Counter)
    listener_saw: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    crashed: list[str] = field(default_factory=list)

    def saw(self, attack: str, outcome: object) -> None:
        self.statuses.setdefault(attack, Counter())[str(outcome)] += 1

    def server_errors(self) -> list[str]:
        """Attacks answered with a 5xx (a request that broke something instead of a 4xx)."""
        return [a for a, c in self.statuses.items() if any(k.startswith("5") for k in c)]

    def report(self) -> list[str]:
        lines = [f"chaos: {self.rounds} rounds of every attack"]
        for attack, seen in sorted(self.statuses.items()):
            lines.append(f"  {attack:24s} {dict(seen)}")
        lines.append("  worst GET /health latency during the attacks (ms): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in self.worst_health_ms.items()))  # fmt: skip
        lines.append(f"  /health failures: {dict(self.health_failures) or 'none'}")
        lines.append(f"  the attacker's listener was sent: {dict(self.listener_saw) or 'nothing'}")
        lines.extend(f"  attacker error: {c}" for c in self.crashed)
        return lines


def unverified_tls() -> ssl.SSLContext:
    """TLS that does not check the server's certificate (bound to a peer id, not a host)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def _record(addrs: list[str]) -> dict:
    """A record of a fresh identity claiming every block for 10 years, signed by hand (so that
    addresses `sign_record` would refuse can be announced)."""
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, addrs, "0.1.0")
    fields.update(role="server", model="chaos", model_fingerprint="f00d", num_blocks=64,
                  start_block=0, end_block=64, dtype="float32", quant="none", throughput=1e9,
                  seq=int(time.time() * 1e6), expires_at=time.time() + TEN_YEARS)  # fmt: skip
    sig = ident.sign(canonical_bytes(fields))
    return {**fields, "signature": base64.b64encode(sig).decode("ascii")}


def _deep_schema_body(depth: int) -> bytes:
    """A chat body whose json_schema nests `depth` objects (written by hand: orjson refuses
    to encode past 255 levels)."""
    schema = b'{"type":"string"}'
    for _ in range(depth):
        schema = b'{"type":"object","properties":{"a":' + schema + b'},"required":["a"]}'
    return (b'{"model":"soak","max_tokens":4,"messages":[{"role":"user","content":"hi"}],'
            b'"response_format":{"type":"json_schema","json_schema":{"name":"deep","schema":'
            + schema + b"}}}")  # fmt: skip


class Attacker:
    def __init__(self, target: Target, found: Findings) -> None:
        self.t = target
        self.found = found
        self.listener_port = 0
        api_headers = {"Authorization": f"Bearer {target.api_key}",
                       "Content-Type": "application/json"}  # fmt: skip
        self.api_headers = api_headers
        words = "lorem ipsum dolor sit amet " * (7 * 2**20 // 27)
        self.big_chat = orjson.dumps({"model": "soak", "max_tokens": 4, "messages": [
            {"role": "user", "content": words}]})  # fmt: skip
        tools = [{"type": "function", "function": {
            "name": f"tool_{i}", "description": "a tool", "parameters": {
                "type": "object", "properties": {"x": {"type": "string"}}}}}
                 for i in range(3000)]  # fmt: skip
        self.many_tools = orjson.dumps({"model": "soak", "max_tokens": 4, "tools": tools,
                                        "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        self.deep_schema = _deep_schema_body(500)

    # -- the listener a steered push would reach ------------------------------------------------
    async def _listen(self) -> web.AppRunner:
        async def any_request(request: web.Request) -> web.Response:
            self.found.listener_saw[f"{request.method} {request.path}"] += 1
            return web.Response(status=404)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_request)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, LISTENER, 0)
        await site.start()
        self.listener_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    # -- the attacks ------------------------------------------------------------------------------
    async def _post(self, http: aiohttp.ClientSession, attack: str, url: str, data: bytes,
                    headers: dict[str, str], timeout: float = 120) -> None:  # fmt: skip
        try:
            async with http.post(url, data=data, headers=headers,
                                 timeout=aiohttp.ClientTimeout(total=timeout)) as r:  # fmt: skip
                body = await r.read()
                code = ""
                if r.status >= 400:
                    with contextlib.suppress(Exception):
                        code = " " + str(orjson.loads(body)["error"].get("code"))
                self.found.saw(attack, f"{r.status}{code}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.found.saw(attack, type(exc).__name__)

    async def gossip(self, http: aiohttp.ClientSession) -> None:
        flood = [_record([f"http://127.0.0.9:{1000 + i}"]) for i in range(300)]
        lst = f"http://{LISTENER}:{self.listener_port}"
        steered = [_record([f"{lst}/internal/admin?op=wipe&x="]),
                   _record(["http://127.0.0.9:9", lst])]  # fmt: skip
        for name, records in (("gossip_flood", flood), ("steered_addresses", steered)):
            body = orjson.dumps({"peer_id": records[0]["peer_id"], "records": records,
                                 "nonce": new_nonce()})  # fmt: skip
            await self._post(http, name, f"{self.t.seed_url}/swarm/gossip", body,
                             {"Content-Type": "application/json"})  # fmt: skip

    async def bodies(self, http: aiohttp.ClientSession, url: str) -> None:
        over = b"\0" * int(self.t.max_body_mb * 2**20 + 1024)
        await self._post(http, "body_past_limit", f"{url}/forward", over,
                         {"Content-Type": MEDIA_TYPE})  # fmt: skip
        await self._post(http, "junk_body", f"{url}/forward", b"\x93junk" * (2**20 // 5 * 2),
                         {"Content-Type": MEDIA_TYPE})  # fmt: skip

    async def pushes(self, http: aiohttp.ClientSession, url: str) -> None:
        hidden = torch.zeros(1, 1, self.t.hidden_size)
        for name, params in (
            ("push_no_session", {"session_id": "00" * 8, "step_id": 1, "position": 0}),
            ("push_forged_token", {"session_id": "00" * 8, "step_id": 1, "position": 0,
                                   "push_token": "ab" * 16}),
        ):  # fmt: skip
            try:
                async with http.ws_connect(f"{url}/push") as ws:
                    await ws.send_bytes(encode_frame(params, {"hidden_states": hidden}))
                    reply = await ws.receive(timeout=20)
                    text = str(reply.data)
                    self.found.saw(
                        name, "push_forbidden" if "push_forbidden" in text else text[:60]
                    )
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.found.saw(name, type(exc).__name__)

    async def kv_hog(self, http: aiohttp.ClientSession, url: str, start: int, end: int) -> None:
        socks = []
        try:
            for _ in range(8):
                ws = await http.ws_connect(f"{url}/inference")
                socks.append(ws)
                await ws.send_str(orjson.dumps(m.OpenSession(
                    self.t.fingerprint, start, end, self.t.max_length, 1, "float32").to_wire()
                ).decode())  # fmt: skip
                reply = orjson.loads((await ws.receive(timeout=30)).data)
                if reply["type"] == "session_opened":
                    self.found.saw("kv_hog", "opened")
                    continue
                self.found.saw("kv_hog", reply.get("code", reply["type"]))
                break
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.found.saw("kv_hog", type(exc).__name__)
        finally:
            for ws in socks:
                await ws.close()

    async def long_forward(self, http: aiohttp.ClientSession, url: str, start: int,
                           end: int) -> None:  # fmt: skip
        req = m.ForwardRequest(self.t.fingerprint, start, end,
                               torch.randn(1, 2048, self.t.hidden_size) * 0.1)  # fmt: skip
        await self._post(http, "long_forward_2048", f"{url}/forward", m.encode(req),
                         {"Content-Type": MEDIA_TYPE}, timeout=300)  # fmt: skip

    async def api(self, http: aiohttp.ClientSession) -> None:
        chat = f"{self.t.api_url}/v1/chat/completions"
        await asyncio.gather(*(self._post(http, "api_7MiB_chat", chat, self.big_chat,
                                          self.api_headers) for _ in range(4)))  # fmt: skip
        await self._post(http, "api_3000_tools", chat, self.many_tools, self.api_headers)
        await self._post(http, "api_schema_500_deep", chat, self.deep_schema, self.api_headers)
        cross = {"Authorization": self.api_headers["Authorization"], "Origin": "http://evil.test",
                 "Content-Type": "text/plain"}  # fmt: skip
        body = orjson.dumps({"model": "soak", "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        await self._post(http, "api_cross_origin_text", chat, body, cross)

    async def one_round(self, http: aiohttp.ClientSession) -> None:
        half = self.t.num_blocks // 2
        spans = [(0, half), (half, self.t.num_blocks)]
        await self.gossip(http)
        for i, url in enumerate(self.t.server_urls):
            start, end = spans[0] if i == 0 else spans[1]
            await self.bodies(http, url)
            await self.pushes(http, url)
            await self.kv_hog(http, url, start, end)
        forward = asyncio.create_task(self.long_forward(http, self.t.server_urls[0], *spans[0]))
        await self.api(http)
        await forward
        self.found.rounds += 1

    async def run(self, stop: float, every: float) -> None:
        runner = await self._listen()
        conn = aiohttp.TCPConnector(local_addr=(ATTACKER, 0), ssl=unverified_tls())
        try:
            async with aiohttp.ClientSession(connector=conn) as http:
                while time.monotonic() < stop:
                    began = time.monotonic()
                    try:
                        await self.one_round(http)
                    except Exception as exc:  # noqa: BLE001 -- reported; the soak goes on
                        self.found.crashed.append(repr(exc))
                    await asyncio.sleep(max(0.0, every - (time.monotonic() - began)))
        finally:
            await runner.cleanup()


def probe_health(urls: dict[str, str], stop: float, found: Findings) -> None:
    """GET /health on each target every 50 ms until `stop`, keeping the worst latency."""

    async def loop() -> None:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=unverified_tls()),
                                         timeout=timeout) as http:  # fmt: skip
            while time.monotonic() < stop:
                for name, url in urls.items():
                    began = time.monotonic()
                    try:
                        async with http.get(f"{url}/health") as r:
                            await r.read()
                            if r.status != 200:
                                found.health_failures[f"{name} {r.status}"] += 1
                    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        found.health_failures[f"{name} {type(exc).__name__}"] += 1
                    ms = (time.monotonic() - began) * 1000
                    found.worst_health_ms[name] = max(found.worst_health_ms.get(name, 0.0), ms)
                await asyncio.sleep(0.05)

    asyncio.run(loop())


def run_chaos(target: Target, stop: float, every: float, probe: dict[str, str],
              found: Findings) -> None:  # fmt: skip
    """Attack until `stop` (a round every `every` s) with /health of `probe` timed on its own
    thread; what is seen goes into `found`."""
    prober = threading.Thread(target=probe_health, args=(probe, stop, found))
    prober.start()
    try:
        asyncio.run(Attacker(target, found).run(stop, every))
    finally:
        prober.join()
