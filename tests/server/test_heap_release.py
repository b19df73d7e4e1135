"""A server hands freed heap memory back to the OS after a prompt (SpanBackend.run_steps):
after steps with over TRIM_AFTER_TOKENS tokens in a row and after each such session's next
step (the decode unit moving the prompt's keys/values into their buffers), never between
plain decode steps; outputs are unchanged either way."""

from __future__ import annotations

import aiohttp
import torch

from drift.server.backend import TRIM_AFTER_TOKENS
from tests.server.wsclient import RawSession

H = 64


async def test_trims_after_a_prompt_and_the_step_after_it_only(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    backend = running.server.backend
    trims: list[int] = []
    backend.trim = lambda: trims.append(backend.chunks_run)
    fp = backend.fingerprint
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randn(1, TRIM_AFTER_TOKENS + 1, H, generator=gen)
    async with aiohttp.ClientSession() as http:
        sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=128)
        history = prompt
        out = await sess.step(prompt, 0)
        assert len(trims) == 1  # the prompt
        for _ in range(3):
            new = torch.randn(1, 1, H, generator=gen)
            out = await sess.step(new, history.shape[1])
            history = torch.cat([history, new], 1)
            assert len(trims) == 2  # the session's step after its prompt, then none
        short = torch.randn(1, TRIM_AFTER_TOKENS, H, generator=gen)  # a draft: not a prompt
        out = await sess.step(short, history.shape[1])
        history = torch.cat([history, short], 1)
        assert len(trims) == 2
        want = backend.span.forward(history)[:, -short.shape[1] :]
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
        await sess.close()
