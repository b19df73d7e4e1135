"""from_pretrained with the keyword arguments transformers users pass: those that matter work
(token, revision, cache_dir, device, dtype, config and its fields), those that do not apply
warn and change nothing, remote code and unknown arguments are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, BitsAndBytesConfig

from drift.client import AutoDistributedModelForCausalLM
from tests.models.hub_cache import COMMIT, hub_cache

TOL = 1e-4


def _logits_match(model, local) -> bool:
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        return bool((model(ids).logits - local(ids).logits).abs().max() < TOL)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(device_map="auto"), r"device_map=\.\.\.\) is ignored: the client holds only"),
        (dict(low_cpu_mem_usage=True), r"low_cpu_mem_usage=\.\.\.\) is ignored"),
        (dict(quantization_config=BitsAndBytesConfig(load_in_8bit=True)),
         r"quantization_config=\.\.\.\) is ignored: the client.s embeddings and head stay"),
        (dict(load_in_4bit=True), r"load_in_4bit=\.\.\.\) is ignored"),
        (dict(attn_implementation="eager"), "attention runs on the servers"),
    ],
)  # fmt: skip
def test_arguments_that_do_not_apply_warn_and_change_nothing(
    swarm, model_dir, local_model, opened, kwargs, says
):
    with pytest.warns(UserWarning, match=says):
        model = AutoDistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=swarm.token, **kwargs
        )
    opened.append(model)
    assert _logits_match(model, local_model)


def test_refused_arguments(swarm, model_dir):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['no_such_thing'\]"):
        AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token,
                                                        no_such_thing=1)  # fmt: skip
    with pytest.raises(ValueError, match="trust_remote_code=True is refused"):
        AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token,
                                                        trust_remote_code=True)  # fmt: skip
    other = AutoConfig.from_pretrained(model_dir)
    other.num_attention_heads = 2
    with pytest.raises(ValueError, match=r"another architecture .*num_attention_heads"):
        AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token,
                                                        config=other)  # fmt: skip


def test_config_fields_and_config_object(swarm, model_dir, local_model, opened):
    by_field = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=swarm.token, output_hidden_states=True, trust_remote_code=False
    )
    config = AutoConfig.from_pretrained(model_dir)
    config.output_hidden_states = True
    by_config = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=swarm.token, config=config
    )
    opened += [by_field, by_config]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        for model in (by_field, by_config):
            assert len(model(ids).hidden_states) == local_model.config.num_hidden_layers + 1


def test_token_revision_and_cache_dir_reach_the_hub(
    bg_swarms, model_dir, local_model, tmp_path, monkeypatch, opened
):
    """A Hub id (its cache laid out by hand, offline): the token reaches huggingface_hub."""
    import huggingface_hub

    hub_cache("org/tiny-token", model_dir)
    seen: list[dict] = []
    real = huggingface_hub.snapshot_download

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    swarm = bg_swarms.start("org/tiny-token", [(0, 4)], cache_dir=tmp_path)
    seen.clear()
    model = AutoDistributedModelForCausalLM.from_pretrained(
        "org/tiny-token", initial_peers=swarm.token, token="hf_not_a_real_token", revision=COMMIT,
        cache_dir=tmp_path,
    )  # fmt: skip
    opened.append(model)
    assert seen and all(k["token"] == "hf_not_a_real_token" for k in seen)
    assert all(k["revision"] == COMMIT for k in seen)
    assert _logits_match(model, local_model)


def test_dtype_auto_is_the_checkpoints(swarm, model_dir, tmp_path, opened):
    copy = Path(shutil.copytree(model_dir, tmp_path / "bf16"))
    config = json.loads((copy / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (copy / "config.json").write_text(json.dumps(config))
    model = AutoDistributedModelForCausalLM.from_pretrained(copy, initial_peers=swarm.token,
                                                            dtype="auto")  # fmt: skip
    opened.append(model)
    assert model.dtype == torch.bfloat16


def _devices() -> list[str]:
    found = ["cpu"]
    if torch.cuda.is_available():
        found.append("cuda")
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


@pytest.mark.parametrize("device", _devices())
def test_device_is_honoured_end_to_end(swarm, model_dir, local_model, opened, device):
    """The client's parts live on `device`; inputs there give outputs there, equal to the
    local model's; the wire takes the CPU copies (on this machine's CPU-only runs, `cpu`)."""
    model = AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token,
                                                            device=device)  # fmt: skip
    opened.append(model)
    where = torch.device(device)
    assert model.device.type == where.type
    assert all(p.device.type == where.type for p in model.parameters())
    ids = torch.tensor([[3, 14, 15, 92, 65]], device=where)
    with torch.no_grad():
        out = model(ids, use_cache=True, output_hidden_states=True)
        nxt = model(ids[:, -1:], cache=out.cache)
        greedy = model.generate(ids, max_new_tokens=4, do_sample=False)
        hidden = model.model.layers(model.model.embed_tokens(ids))
    for tensor in (out.logits, nxt.logits, greedy, hidden, *out.hidden_states):
        assert tensor.device.type == where.type
    with torch.no_grad():
        ref = local_model(ids.cpu()).logits
        ref_greedy = local_model.generate(ids.cpu(), max_new_tokens=4, do_sample=False)
    assert (out.logits.cpu() - ref).abs().max() < TOL
    assert torch.equal(greedy.cpu(), ref_greedy)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_an_absent_device_is_a_clear_error(swarm, model_dir):
    with pytest.raises(Exception, match="device 'cuda' is not available on this machine"):
        AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token,
                                                        device="cuda")  # fmt: skip
