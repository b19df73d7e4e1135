"""Quantized block servers: announced as such, chained with unquantized ones, measured apart."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
import torch

from drift.server.build import load_server
from drift.server.config import ServerConfig
from drift.wire import messages as m
from tests.server.posts import post
from tests.server.reference import head_logits, load_reference

pytest.importorskip("bitsandbytes")


async def test_a_chain_may_mix_quantized_and_float_servers(servers, tiny_llama):
    a = await servers(tiny_llama, 0, 2, quant_type="nf4")
    b = await servers(tiny_llama, 2, 4)  # float32, no quantization
    assert a.server.backend.fingerprint == b.server.backend.fingerprint  # one model
    ref = load_reference(tiny_llama)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    fp = a.server.backend.fingerprint
    with torch.no_grad():
        expected = ref(ids).logits
        hidden = ref.model.embed_tokens(ids)
    async with aiohttp.ClientSession() as http:
        h1 = await post(
            http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, hidden), m.ForwardResponse
        )
        h2 = await post(http, f"{b.url}/forward", m.ForwardRequest(fp, 2, 4, h1.hidden_states),
                        m.ForwardResponse)  # fmt: skip
        async with http.get(f"{a.url}/blocks") as resp:
            info = await resp.json()
    with torch.no_grad():
        got = head_logits(ref, h2.hidden_states)
    error = float((got - expected).norm() / expected.norm())
    assert 0 < error < 0.3  # half the blocks in nf4 (test_quant: 0.18 with all four)
    assert info["quant"] == "nf4" and info["dtype"] == "float32"
    assert a.node.record.quant == "nf4" and b.node.record.quant == "none"


def test_throughput_is_measured_per_quantization(tiny_llama, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="drift.server")
    base = ServerConfig(model=str(tiny_llama), start_block=0, end_block=2, device="cpu",
                        cache_dir=tmp_path)  # fmt: skip
    for quant in ("none", "int8", "none"):  # the second "none" is read from the cache
        server = load_server(ServerConfig(**{**base.__dict__, "quant_type": quant}))
        assert server.backend.quant == quant and server.throughput > 0
        server.backend.close()
    table = json.loads((tmp_path / "throughput.json").read_text())
    assert sorted(key.rsplit("|", 1)[1] for key in table) == ["int8", "none"]
    measured = [r.getMessage() for r in caplog.records if "measured throughput" in r.getMessage()]
    assert len(measured) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(" on the CPU")[0] for r in warnings] == ["--quant_type int8"]


def test_unknown_quantization_is_refused_before_loading(tiny_llama):
    from drift.wire.errors import BadRequest

    with pytest.raises(BadRequest, match="unknown quantization 'fp8'"):
        load_server(ServerConfig(model=str(tiny_llama), device="cpu", quant_type="fp8"))


async def test_a_span_move_keeps_the_quantization(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2, quant_type="int8")
    await running.server.move_to(1, 4, drain_timeout_s=0)
    backend = running.server.backend
    assert (backend.start_block, backend.end_block) == (1, 4)
    assert backend.quant == backend.span.quant == "int8"
    assert running.node.record.quant == "int8" and running.node.record.end_block == 4
