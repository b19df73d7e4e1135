"""One distributed model, several threads at once, over real servers on loopback.

Each thread's generate() gets its own remote sessions: outputs equal the sequential ones
(and local transformers), `inference_session()` is per thread, `generate(session=...)`
continues an explicit session, and no session is left open on the servers afterwards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
import torch
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.timeout(180)

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [40, 41, 42, 43, 44, 45, 46], [200, 3, 17]]


async def _open_sessions(swarm) -> list[int]:
    async with aiohttp.ClientSession() as http:
        counts = []
        for running in swarm.servers:
            async with http.get(f"{running.url}/blocks") as r:
                counts.append((await r.json())["active_sessions"])
        return counts


async def _wait_no_sessions(swarm, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (counts := await _open_sessions(swarm)) != [0] * len(swarm.servers):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    return counts


def _run_together(fns: list) -> list:
    """Call every fn in its own thread, all released at the same moment."""
    barrier = threading.Barrier(len(fns))

    def call(fn):
        barrier.wait()
        return fn()

    with ThreadPoolExecutor(len(fns)) as pool:
        return [f.result() for f in [pool.submit(call, fn) for fn in fns]]


async def test_concurrent_generate_on_one_model(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [torch.tensor([p]) for p in PROMPTS]
    refs = [local.generate(ids, max_new_tokens=12, do_sample=False) for ids in prompts]
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])

    def gen(ids):
        return lambda: model.generate(ids, max_new_tokens=12, do_sample=False)

    sequential = [await asyncio.to_thread(gen(ids)) for ids in prompts]
    assert await _wait_no_sessions(swarm) == [0, 0]
    for _ in range(2):  # twice: a finishing call must not close another's session
        together = await asyncio.to_thread(_run_together, [gen(ids) for ids in prompts])
        for out, seq, ref in zip(together, sequential, refs, strict=True):
            assert torch.equal(out, seq)
            assert torch.equal(out, ref)
    assert await _wait_no_sessions(swarm) == [0, 0]


async def test_inference_session_is_per_thread_and_explicit(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [torch.tensor([p]) for p in PROMPTS[:3]]
    refs = [local.generate(ids, max_new_tokens=8, do_sample=False) for ids in prompts]
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])

    def in_session(ids):
        def run():
            with model.inference_session(max_length=32):
                first = model.generate(ids, max_new_tokens=4, do_sample=False)
                second = model.generate(None, max_new_tokens=4, do_sample=False)
            return first, second

        return run

    def explicit(ids):
        def run():
            with model.open_session(max_length=32) as session:
                first = model.generate(ids, max_new_tokens=4, session=session)
                # another thread continues this thread's session
                with ThreadPoolExecutor(1) as pool:
                    second = pool.submit(
                        model.generate, None, max_new_tokens=4, session=session
                    ).result()
                assert session.position == ids.shape[1] + 7
            return first, second

        return run

    fns = [in_session(prompts[0]), in_session(prompts[1]), explicit(prompts[2])]
    results = await asyncio.to_thread(_run_together, fns)
    for (first, second), ids, ref in zip(results, prompts, refs, strict=True):
        assert torch.equal(first, ref[:, : ids.shape[1] + 4])
        assert torch.equal(second, ref[:, ids.shape[1] + 4 :])  # the new tokens (as Petals)
    assert await _wait_no_sessions(swarm) == [0, 0]

    def nested():
        with model.inference_session(max_length=8):
            with pytest.raises(RuntimeError, match="already active in this thread"):
                with model.inference_session(max_length=8):
                    pass
        with pytest.raises(ValueError, match="session= or cache="):
            with model.open_session(max_length=8) as s:
                model.generate(prompts[0], session=s, cache=model.cache_for(s))

    await asyncio.to_thread(nested)
