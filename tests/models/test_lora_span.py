"""LoRA on spans: the modules it can adapt in every family, and quantized spans, where it is
added on top of the bitsandbytes base (the delta and its gradients match float32's)."""

from __future__ import annotations

import pytest
import torch

from drift.models.checkpoint import open_checkpoint
from drift.models.span import ModelSpan
from drift.wire.lora import lora_name
from tests.tiny_models import FAMILIES


def _weights(span: ModelSpan, r: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights for every linear module of the span's first two blocks."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for t in span.lora_targets:
        if t.block < span.start_block + 2:
            out[lora_name(t.block, t.module, "A")] = (
                torch.randn(r, t.in_features, generator=gen) * 0.2
            )
            out[lora_name(t.block, t.module, "B")] = (
                torch.randn(t.out_features, r, generator=gen) * 0.2
            )
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_takes_lora_on_its_linear_modules(family, tiny_dirs):
    span = ModelSpan.load(open_checkpoint(str(tiny_dirs[family])), 1, 3)
    assert span.lora_targets and {t.block for t in span.lora_targets} == {1, 2}
    hidden = torch.randn(1, 4, span.config.hidden_size)
    plain = span.forward(hidden)
    adapted = span.forward(hidden, extras=_weights(span))
    assert (adapted - plain).abs().max() > 1e-4
    assert torch.equal(span.forward(hidden), plain)  # the hooks add nothing afterwards


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_lora_on_a_quantized_span(quant, tiny_dirs):
    pytest.importorskip("bitsandbytes")
    ckpt = open_checkpoint(str(tiny_dirs["llama"]))
    dense, packed = ModelSpan.load(ckpt, 0, 2), ModelSpan.load(ckpt, 0, 2, quant=quant)
    weights = _weights(dense)
    hidden, grad = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    deltas, grads = [], []
    for span in (dense, packed):
        base = span.forward(hidden)
        deltas.append(span.forward(hidden, extras=weights) - base)
        _, _, named = span.run_backward(0, 2, hidden, grad, None, None, weights)
        grads.append(named)
    rel = (deltas[1] - deltas[0]).norm() / deltas[0].norm()
    assert deltas[0].abs().max() > 1e-2 and rel < (0.05 if quant == "int8" else 0.35)
    for name in weights:
        g_dense, g_packed = grads[0][name], grads[1][name]
        assert g_packed.abs().max() > 0
        assert (g_packed - g_dense).norm() / g_dense.norm() < (0.05 if quant == "int8" else 0.35)


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_names_match_every_family(family, tmp_path):
    """peft's adapter of a tiny model: the server reads every block's weights of it, and the
    client's targets for the same target_modules are the modules peft adapted. (MoE families:
    attention only; peft's LoRA on fused expert parameters is not a linear module DRIFT can
    adapt, and a server refuses such an adapter naming the module.)"""
    from peft import LoraConfig, get_peft_model

    from drift.client.lora import LoraSettings, find_targets
    from drift.models.peft_files import read_adapter
    from drift.models.registry import get_adapter
    from tests.tiny_models import build_tiny

    local = build_tiny(family)
    moe = family in ("mixtral", "qwen3_moe", "deepseek_v3")
    target_modules = ["q_proj", "o_proj"] if moe else "all-linear"
    config = LoraConfig(r=2, target_modules=target_modules, init_lora_weights=False)
    peft_model = get_peft_model(local, config)
    peft_model.save_pretrained(tmp_path)
    adapted = {name.removeprefix("base_model.model.").removesuffix(".lora_A.default.weight")
               for name, _ in peft_model.named_parameters() if name.endswith("lora_A.default.weight")}  # fmt: skip
    n = local.config.num_hidden_layers
    weights = read_adapter(tmp_path, get_adapter(local.config).layer_prefix, 0, n)
    assert len(weights) == 2 * len(adapted)
    settings = LoraSettings.parse({"target_modules": target_modules})
    targets = find_targets(local.config, settings, n)
    assert {name for _, name in targets} == adapted


def test_adapter_on_fused_moe_experts_is_refused(tmp_path, tiny_dirs):
    from peft import LoraConfig, get_peft_model

    from drift.server.adapters import load_adapters
    from drift.wire.errors import BadRequest
    from tests.tiny_models import build_tiny

    config = LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(build_tiny("mixtral"), config).save_pretrained(tmp_path)
    span = ModelSpan.load(open_checkpoint(str(tiny_dirs["mixtral"])), 0, 2)
    with pytest.raises(BadRequest, match="no LoRA-adaptable module 'mlp.experts"):
        load_adapters(span, [("moe", str(tmp_path))])


def test_lora_settings_from_peft_and_what_is_refused():
    from peft import LoraConfig

    from drift.client.lora import LoraSettings

    s = LoraSettings.parse(LoraConfig(r=4, lora_alpha=16, target_modules=["v_proj", "q_proj"]))
    assert (s.r, s.lora_alpha, s.target_modules, s.scale) == (4, 16.0, ("q_proj", "v_proj"), 4.0)
    assert LoraSettings.parse({"r": 4, "alpha": 8, "use_rslora": True}).scale == 4.0
    refused = [dict(lora_dropout=0.1), dict(use_dora=True), dict(bias="all"),
               dict(layers_to_transform=[0]), dict(init_lora_weights="pissa"),
               dict(rank_pattern={"q_proj": 2})]  # fmt: skip
    for kwargs in refused:
        config = LoraConfig(r=4, target_modules=["q_proj"], **kwargs)
        with pytest.raises(ValueError, match="through the swarm"):
            LoraSettings.parse(config)
