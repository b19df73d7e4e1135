"""Issue 24, finding 5 (push): a pushed step is bound to its session by the session's push
token, not only by its 64-bit id. Against a real three-server chain on loopback, mid-way
through a pushed generation, a stranger who learnt (or guessed) the middle session's id opens
/push (an open swarm: no key) and pushes steps into it without the token, with a wrong one,
and for a guessed id: each is refused on the stranger's link with `push_forbidden`, the
session's state is untouched, no honest push is refused, and the tokens equal local
transformers'."""

from __future__ import annotations

import asyncio

import aiohttp
import torch

from drift.wire import codec
from drift.wire.errors import PushForbidden
from drift.wire.messages import ErrorMessage
from drift.wire.step import StepRequest
from tests.client.faults import AtStep
from tests.client.push_helpers import IDS, SPANS, links, wait_all_know_each_other
from tests.server.reference import load_reference

FORGED_STEP = 10**6  # a step id past any honest one: a taken push would stop later pushes


async def _forge(url: str, width: int, session_id: str) -> list[ErrorMessage]:
    """Three forged pushes over one stranger's /push link; what the link says back."""
    hidden = torch.randn(IDS.shape[0], 1, width)
    forged = [
        StepRequest(FORGED_STEP, 0, hidden, session_id=session_id),  # no token
        StepRequest(FORGED_STEP, 0, hidden, session_id=session_id, push_token="0" * 32),
        StepRequest(FORGED_STEP, 0, hidden, session_id="ab" * 8, push_token="0" * 32),
    ]
    said = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/push") as ws:
        for step in forged:
            await ws.send_bytes(codec.encode(step))
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            said.append(ErrorMessage.from_wire(codec.read_text(msg.data)[1]))
    return said


async def test_a_forged_push_with_a_leaked_id_is_refused_and_the_session_goes_on(
    tiny_dirs, swarms, sdk_models
) -> None:
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, SPANS)
    await wait_all_know_each_other(swarm)
    model = await sdk_models.open(model_dir, swarm.token)
    middle = swarm.servers[1]
    loop = asyncio.get_running_loop()
    seen: dict[str, object] = {}

    def attack() -> None:  # on the generating thread, at a step mid-way
        sessions = middle.server.sessions.sessions
        (session_id,) = sessions  # the leaked id: the middle server's one session
        before = sessions[session_id].last_step
        said = asyncio.run_coroutine_threadsafe(
            _forge(middle.url, middle.server.backend.hidden_size, session_id), loop
        ).result(timeout=60)
        seen.update(said=said, session_id=session_id, before=before,
                    after=sessions[session_id].last_step)  # fmt: skip

    gen = await asyncio.to_thread(model.generate, IDS, max_new_tokens=6, do_sample=False,
                                  logits_processor=[AtStep(3, attack)])  # fmt: skip
    assert links(swarm) == [1, 1, 0]  # the generation really pushed: first -> middle -> last
    said = seen["said"]
    assert [m.code for m in said] == [PushForbidden.code] * 3, said
    assert all("push_token" in m.message for m in said), said
    assert seen["session_id"] in said[0].message and "ab" * 8 in said[2].message
    assert seen["after"] == seen["before"] < FORGED_STEP  # the forged steps never ran
    # only the three forged pushes were refused: every honest one carried its token
    refused = {k: v for k, v in middle.server.metrics.requests.items() if k[0] == "/push:step"}
    assert refused == {("/push:step", "403"): 3}, refused
    local = load_reference(model_dir)
    assert torch.equal(gen, local.generate(IDS, max_new_tokens=6, do_sample=False))
