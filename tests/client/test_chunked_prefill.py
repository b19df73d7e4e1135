"""Long steps travel in chunks pipelined along the chain, with the numbers of one piece.

A 4,096-token prompt on a model of hidden size 4,096 (64 MiB of activations: past the
servers' 64 MiB body limit as one message) goes through two servers in 512-token chunks;
small chunks over tiny models (llama, Gemma 4 with its per-layer inputs and shared K/V)
give local transformers' tokens; a span failing mid-pipeline is replaced and the rest of
the chunks go on through the replacement. A training batch goes to /forward and /backward
in groups of rows (forward_chunk_bytes) with local loss and gradients.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from drift.client import ClientConfig
from drift.client.transport import SpanSocket
from drift.wire.errors import PeerUnavailable
from tests.server.reference import load_reference

pytestmark = pytest.mark.timeout(300)
GREEDY = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)


def _wide_model(directory):
    """Two blocks of hidden size 4096 and a narrow inside (2 heads of 16, MLP of 16)."""
    config = AutoConfig.for_model(
        "llama", hidden_size=4096, num_hidden_layers=2, intermediate_size=16,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=256,
        max_position_embeddings=8192, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


async def test_4096_tokens_of_hidden_4096_through_two_servers(swarms, sdk_models, tmp_path):
    local = _wide_model(tmp_path / "wide")
    swarm = await swarms.start(tmp_path / "wide", [(0, 1), (1, 2)], inference_max_length=4096)
    assert swarm.seed.server.config.max_body_bytes == 64 << 20
    # 8 MiB chunks on a busy machine: a step may take longer than the adaptive default
    config = ClientConfig(min_step_timeout_s=60.0, connect_timeout_s=30.0)
    model = await sdk_models.open(tmp_path / "wide", swarm.token, client_config=config)
    ids = torch.randint(0, 256, (1, 4096), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        embeds = local.model.embed_tokens(ids)
        want = local(ids).logits[0, -8:]

    def run():
        with model.open_session(max_length=4096) as session:
            out = session.step(embeds)
            assert [len(s.history) for s in session.spans] == [8, 8]  # 512-token chunks
            return out

    out = await asyncio.to_thread(run)
    with torch.no_grad():
        got = local.lm_head(local.model.norm(out))[0, -8:]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma4_text"])
async def test_small_chunks_give_local_tokens(family, tiny_dirs, swarm_model):
    model_dir = tiny_dirs(family)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    spans = [(0, 2), (2, 4)] if family == "llama" else [(0, 3), (3, 5), (5, 6)]
    _, model = await swarm_model(model_dir, spans,
                                 client_config=ClientConfig(prefill_chunk_tokens=3))  # fmt: skip
    ids = torch.randint(3, 249, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = local.generate(ids, **GREEDY)
        out = await asyncio.to_thread(model.generate, ids, **GREEDY)
        assert torch.equal(out, ref)
        assert (await asyncio.to_thread(lambda: (model(ids).logits - local(ids).logits)
                                        .abs().max())) < 1e-5  # fmt: skip


async def test_a_span_failing_mid_pipeline_is_replaced(tiny_dirs, swarm_model, monkeypatch):
    """The upper span's second chunk fails: the pipeline stops, the span is routed to the
    twin server, its first chunk replayed there, and the remaining chunks go on."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])
    ref = local.generate(ids, **GREEDY)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4), (2, 4)],
                                     client_config=ClientConfig(prefill_chunk_tokens=3))  # fmt: skip
    calls: list[tuple[str, int]] = []
    step = SpanSocket.step

    async def flaky(self, hidden, position, **kw):
        calls.append((self.hop.peer_id, self.hop.start_block))
        if self.hop.start_block == 2 and sum(1 for c in calls if c[1] == 2) == 2:
            raise PeerUnavailable("injected", peer_id=self.hop.peer_id)
        return await step(self, hidden, position, **kw)

    monkeypatch.setattr(SpanSocket, "step", flaky)
    out = await asyncio.to_thread(model.generate, ids, **GREEDY)
    assert torch.equal(out, ref)
    upper = [peer for peer, start in calls if start == 2]
    assert len(set(upper)) == 2 and upper[0] == upper[1] != upper[2]  # replaced after 2
    assert len(swarm.servers) == 3


@pytest.mark.parametrize("family", ["llama", "gemma4_text"])
async def test_forward_in_row_groups_gives_local_loss_and_gradients(family, tiny_dirs,
                                                                    swarm_model):  # fmt: skip
    """/forward and /backward of a 5-row batch in groups of 2 rows (all at once): the loss,
    the gradients w.r.t. the input embeddings and the blocks' outputs equal local ones."""
    model_dir = tiny_dirs(family)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    spans = [(0, 2), (2, 4)] if family == "llama" else [(0, 3), (3, 6)]
    one_row = 7 * local.config.hidden_size * 4  # bytes of a row's hidden states
    config = ClientConfig(forward_chunk_bytes=2 * one_row)
    swarm, model = await swarm_model(model_dir, spans, client_config=config)
    ids = torch.randint(3, 249, (5, 7), generator=torch.Generator().manual_seed(4))
    forwards_before = await _forwards(swarm)

    def grads(m):
        embeds = m.get_input_embeddings()(ids).detach().requires_grad_(True)
        out = m(inputs_embeds=embeds, labels=ids, output_hidden_states=True)
        out.loss.backward()
        return out.loss.detach(), embeds.grad, out.hidden_states[-2].detach()

    loss, grad, states = await asyncio.to_thread(grads, model)
    want_loss, want_grad, want_states = grads(local)
    assert abs(float(loss) - float(want_loss)) < 1e-5
    assert (grad - want_grad).abs().max() < 1e-4
    assert (states - want_states).abs().max() < 1e-4
    assert await _forwards(swarm) - forwards_before == 3 * len(spans)  # 3 groups per hop


async def _forwards(swarm) -> int:
    """/forward requests answered with 200 by every server of `swarm`."""
    total = 0
    async with aiohttp.ClientSession() as http:
        for running in swarm.servers:
            async with http.get(f"{running.url}/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith('drift_requests_total{route="/forward",status="200"}'):
                        total += int(float(line.split()[-1]))
    return total
