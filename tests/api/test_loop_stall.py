"""Issue 24, finding 3: nothing CPU-bound on the API's event loop.

Four 7 MB chat bodies (the largest body the API takes, ~150,000 short turns each) are
decoded and rendered through the chat template off the loop: /health keeps answering while they are read, and
each is then refused for its length. Counted, not timed: the health polls answered while the
big requests were in flight (on the loop they answered none until all four were done).
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.api.apps import API_KEY, MODEL_ID

pytestmark = pytest.mark.timeout(300)
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
BODY_CHARS = 7 * 2**20  # the app's default limit is 8 MiB


def big_chat_body() -> bytes:
    """~7 MiB of short chat turns: decoding and rendering them through the chat template is
    the CPU-heavy part (a prompt of one 7 MiB text is refused by its length before any of
    that: test_api_limits)."""
    turn = {"role": "user", "content": "the quick brown fox"}
    messages = [turn] * (BODY_CHARS // len(orjson.dumps(turn)))
    return orjson.dumps({"model": MODEL_ID, "max_tokens": 1, "messages": messages})


async def test_health_answers_while_huge_chat_bodies_are_prepared(api_url: str) -> None:
    body = big_chat_body()
    async with aiohttp.ClientSession() as http:

        async def big() -> tuple[int, dict]:
            async with http.post(f"{api_url}/v1/chat/completions", data=body,
                                 headers=AUTH) as resp:  # fmt: skip
                return resp.status, await resp.json()

        async with http.get(f"{api_url}/health") as resp:  # warm: connection pool, routes
            assert resp.status == 200
        tasks = [asyncio.create_task(big()) for _ in range(4)]
        answered = 0
        while not all(t.done() for t in tasks):
            async with http.get(f"{api_url}/health") as resp:
                assert resp.status == 200
            if not all(t.done() for t in tasks):
                answered += 1
            await asyncio.sleep(0.02)
        results = [t.result() for t in tasks]
    for status, payload in results:
        assert status == 400, payload
        assert "maximum context length" in payload["error"]["message"]
    # generous: the loop only has to come round while the bodies are prepared elsewhere
    assert answered >= 20, f"/health answered only {answered} polls while 4 big bodies ran"
