"""Decode steps compiled on the servers (`--compile on`) give local transformers' tokens.

Two real servers over a tiny llama with the lean step compiled (inductor, at start-up: shown
in /blocks) and two with `--compile off`: greedy tokens and logits equal local transformers.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from tests.server.reference import load_reference

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs g++")


@pytest.mark.parametrize("setting", ["on", "off"])
async def test_compiled_servers_decode_like_transformers(setting, tiny_dirs, swarms,
                                                         sdk_models) -> None:  # fmt: skip
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], compile=setting)
    for running in swarm.servers:
        decode = running.server.describe().to_wire()["decode"]
        if setting == "on":
            assert decode["mode"] == "compiled" and decode["compile_s"] > 0, decode
            assert running.server.backend.decode.compiled
        else:
            assert decode["mode"] == "eager" and running.server.backend.decode is None
    model = await sdk_models.open(model_dir, swarm.token)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5))

    def check() -> None:
        greedy = dict(max_new_tokens=12, do_sample=False)
        assert torch.equal(model.generate(ids, **greedy), local.generate(ids, **greedy))
        with torch.no_grad():
            assert (model(ids).logits - local(ids).logits).abs().max() < 1e-4

    await asyncio.to_thread(check)
