"""Training through the swarm: deep prompt tuning and a client-side classification head,
with gradients compared to the same computation in local transformers."""

from __future__ import annotations

import asyncio
import json
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from drift.client.auto import AutoDistributedModelForSequenceClassification

P = 3  # pre_seq_len


def _local_deep_ptune(local, ids, prefix, deep):
    """Loss of the local model with a prefix and deep prompts added before every layer."""

    def add(index):
        def hook(module, args):
            hidden = args[0]
            head = hidden[:, :P] + deep[index].unsqueeze(0)
            return (torch.cat([head, hidden[:, P:]], dim=1), *args[1:])

        return hook

    handles = [
        layer.register_forward_pre_hook(add(i)) for i, layer in enumerate(local.model.layers)
    ]
    try:
        embeds = torch.cat([prefix.unsqueeze(0), local.model.embed_tokens(ids)], dim=1)
        logits = local(inputs_embeds=embeds, use_cache=False).logits[:, P:]
    finally:
        for h in handles:
            h.remove()
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


async def test_deep_ptune_gradients_match_local(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[7, 8, 9, 10, 11, 12]])
    _, model = await swarm_model(
        model_dir, [(0, 1), (1, 4)], tuning_mode="deep_ptune", pre_seq_len=P
    )
    with torch.no_grad():  # non-zero deep prompts, so they change the output
        model.ptune.deep_prompts.copy_(
            torch.randn(model.ptune.deep_prompts.shape, generator=torch.Generator().manual_seed(0)) * 0.1
        )  # fmt: skip

    def remote_grad():
        out = model(ids, labels=ids)
        out.loss.backward()
        pt = model.ptune
        return (
            out.loss.detach(),
            pt.prompt_embeddings.grad.clone(),
            pt.deep_prompts.grad.clone(),
        )

    loss, g_prefix, g_deep = await asyncio.to_thread(remote_grad)
    prefix = model.ptune.prompt_embeddings.detach().clone().requires_grad_(True)
    deep = model.ptune.deep_prompts.detach().clone().requires_grad_(True)
    ref_loss = _local_deep_ptune(local, ids, prefix, deep)
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-4
    assert (g_prefix - prefix.grad).abs().max() < 1e-4
    assert (g_deep - deep.grad).abs().max() < 1e-4
    assert g_deep.abs().sum(dim=(1, 2)).min() > 0  # every block's prompts got gradient


def _classifier_dir(src, dst, num_labels=3):
    """The tiny llama checkpoint plus a `score` head (as a *ForSequenceClassification saves)."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config.update(num_labels=num_labels, pad_token_id=0,
                  id2label={str(i): f"L{i}" for i in range(num_labels)},
                  label2id={f"L{i}": i for i in range(num_labels)})  # fmt: skip
    (dst / "config.json").write_text(json.dumps(config))
    tensors = load_file(src / "model.safetensors")
    gen = torch.Generator().manual_seed(3)
    tensors["score.weight"] = torch.randn(num_labels, config["hidden_size"], generator=gen) * 0.1
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    return dst


async def test_sequence_classification_matches_hf_and_trains(tiny_dirs, tmp_path, swarm_model):
    model_dir = _classifier_dir(tiny_dirs("llama"), tmp_path / "cls")
    local = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    local.eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 0, 0]])  # right-padded with pad id 0
    mask = (ids != 0).long()
    labels = torch.tensor([2, 0])
    _, model = await swarm_model(
        model_dir, [(0, 2), (2, 4)], cls=AutoDistributedModelForSequenceClassification
    )
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["score.weight"]  # the frozen head stays frozen by default
    model.head.embed_tokens.requires_grad_(True)  # opt in: train embeddings too

    def remote():
        out = model(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        return out, model.score.weight.grad.clone(), model.head.embed_tokens.weight.grad

    out, g_score, g_embed = await asyncio.to_thread(remote)
    ref = local(ids, attention_mask=mask, labels=labels)
    ref.loss.backward()
    assert (out.logits - ref.logits).abs().max() < 1e-4
    assert abs(out.loss.item() - ref.loss.item()) < 1e-4
    assert g_score.abs().sum() > 0 and (g_score - local.score.weight.grad).abs().max() < 1e-4
    # gradients flow through the remote blocks back to the client's embeddings
    assert g_embed is not None and g_embed.abs().sum() > 0
    assert (g_embed - local.model.embed_tokens.weight.grad).abs().max() < 1e-4
