"""Done-when of issue 26 on real weights: a client process with a fresh HOME and an empty
working directory answers through servers of `acme-chat-135m` (a SmolLM2 directory) given
only the join token, and the SDK by that name generates what local transformers does."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drift import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "What is the capital of France?"


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_drift_generate_with_nothing_but_the_token(smollm2_dir, tmp_path, swarms,
                                                         sdk_models):  # fmt: skip
    model_dir = tmp_path / "models" / "acme-chat-135m"
    shutil.copytree(smollm2_dir, model_dir, copy_function=os.link,
                    ignore=shutil.ignore_patterns("drift_source.json"))  # fmt: skip
    swarm = await swarms.start(model_dir, [(0, 15), (15, 30)], parts_cache=tmp_path / "srv")
    home, work = tmp_path / "home", tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRIFT_", "HF_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drift.cli", "generate", "--initial_peers", swarm.token, PROMPT,
        "--max_new_tokens", "12", cwd=work, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 400)
    assert proc.returncode == 0, err.decode()
    assert "Paris" in out.decode(), (out + err).decode()
    assert "downloaded" in err.decode() and not list(work.iterdir())  # the cache is in HOME
    assert (home / ".cache" / "drift" / "client-parts" / swarm.fingerprint).is_dir()

    cache = tmp_path / "sdk"
    tokenizer = await asyncio.to_thread(load_tokenizer, "acme-chat-135m",
                                        initial_peers=swarm.token, cache_dir=cache)  # fmt: skip
    messages = [{"role": "user", "content": PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, return_tensors="pt")["input_ids"]  # fmt: skip
    local_ids = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True,
        return_tensors="pt",
    )["input_ids"]  # fmt: skip
    assert torch.equal(ids, local_ids)
    model = await sdk_models.open("acme-chat-135m", swarm.token, cache_dir=cache)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=12, do_sample=False)
    got = await asyncio.to_thread(model.generate, ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, ref)
