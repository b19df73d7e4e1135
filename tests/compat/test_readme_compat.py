"""docs/sdk.md's "### Code written for transformers or Petals" example, run as written on a
tiny llama swarm (its model name and peers replaced; `ids` as README.md's Python API example
defines it), each result checked against local transformers."""

from __future__ import annotations

import re
from pathlib import Path

import torch

SDK_DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def readme_compat_block() -> str:
    section = SDK_DOC.read_text().split("### Code written for transformers or Petals", 1)[1]
    match = re.search(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert match, "docs/sdk.md's compat section has no ```python block"
    return match.group(1)


def test_readme_compat_example_runs(swarm, model_dir, local_model, tokenizer, opened):
    code = readme_compat_block()
    assert '"smollm2"' in code
    ids = tokenizer("A cat sat", return_tensors="pt")["input_ids"]
    from drift import AutoDistributedModelForCausalLM

    scope = {"AutoDistributedModelForCausalLM": AutoDistributedModelForCausalLM,
             "peers": swarm.token, "ids": ids}  # fmt: skip
    with torch.no_grad():
        exec(code.replace('"smollm2"', repr(str(model_dir))), scope)  # noqa: S102
        ref = local_model(ids, use_cache=True)
        nxt = ref.logits[:, -1:].argmax(-1)
        ref_next = local_model(nxt, past_key_values=ref.past_key_values)
        ref_states = local_model(ids, output_hidden_states=True).hidden_states
        ref_hidden = local_model.base_model(ids).last_hidden_state  # normed
    assert (scope["out"].logits - ref_next.logits).abs().max() < 1e-4
    assert len(scope["states"]) == len(ref_states)
    assert all((a - b).abs().max() < 1e-4 for a, b in zip(scope["states"], ref_states, strict=True))
    assert (scope["hidden"] - ref_hidden).abs().max() < 1e-4
    assert scope["model"].client.closed  # the with block closed it
