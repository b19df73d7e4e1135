"""README.md's "## Python API" example, run as written against a real SmolLM2 swarm.

The ```python block is extracted from README.md, its peers string replaced by a real join
token (two in-process block servers of the alias, 0:15 and 15:30), and executed; what it prints and its
logits must equal local transformers. A README block that differs from EXPECTED fails (in
the fast run too), showing the difference: README and this copy change together.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import io
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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


def check_readme_is_expected(block: str) -> None:
    """AssertionError with a diff unless README.md's block is this test's EXPECTED text."""
    diff = "".join(difflib.unified_diff(EXPECTED.splitlines(True), block.splitlines(True),
                                        "EXPECTED (tests/client/test_readme_example.py)",
                                        "README.md ## Python API"))  # fmt: skip
    assert block == EXPECTED, (
        "README.md's Python API example differs from the copy this test runs; change both "
        f"together (the example must run as written, with no undefined name):\n{diff}"
    )


def test_readme_python_example_is_the_tested_text() -> None:
    check_readme_is_expected(readme_python_block())
    with pytest.raises(AssertionError, match=r"(?s)differs.*\+print\(model\)"):
        check_readme_is_expected(EXPECTED + "print(model)\n")


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_readme_python_example(smollm2_cache, monkeypatch, swarms, sdk_models) -> None:
    block = readme_python_block()
    check_readme_is_expected(block)
    assert PEERS_LINE in block
    monkeypatch.setenv("DRIFT_CACHE", str(smollm2_cache))  # the alias resolves offline
    from drift.models.checkpoint import open_checkpoint

    model_dir = Path(open_checkpoint("smollm2", cache_dir=smollm2_cache).path)
    swarm = await swarms.start("smollm2", [(0, 15), (15, 30)])
    scope: dict = {}
    sdk_models.close_later(lambda: scope.get("model"))  # the model the README's code opens
    printed = io.StringIO()
    code = block.replace(PEERS_LINE, f"peers = {swarm.token!r}")
    with contextlib.redirect_stdout(printed):
        await asyncio.to_thread(exec, compile(code, "README.md", "exec"), scope)

    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("A cat sat", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref_out = local.generate(ids, max_new_tokens=5, do_sample=False)
        ref_logits = local(ids).logits
    assert printed.getvalue() == tokenizer.decode(ref_out[0]) + "\n"
    torch.testing.assert_close(scope["logits"], ref_logits, rtol=0, atol=1e-4)
    assert scope["hidden"].shape == (1, ids.shape[1], local.config.hidden_size)
