"""Petals' tests/test_speculative_generation.py (bigscience-workshop/petals, MIT), run against DRIFT.

Changed from Petals' file, and only this: the imports (DRIFT's AutoDistributedConfig,
AutoDistributedSpeculativeModel, DistributedLlamaForSpeculativeGeneration and
RemoteSequential; Petals' load_pretrained_block and MAX_SHORT_INFERENCE_TOKENS from
tests/compat/petals_refs.py; Petals' test_utils globals are placeholders that
tests/compat/conftest.py fills with a tiny llama checkpoint and a fresh swarm); tolerances
are DRIFT's 1e-4 (Petals': 1e-3); @pytest.mark.forked dropped; the speculative test's
"llama only" skip is gone (it read MODEL_NAME at import; DRIFT's speculative model is
transformers' assisted generation and serves every family).
"""

# Petals' own code and formatting, so that the file compares line by line with Petals':
# ruff: noqa: F401, F541, B905
# fmt: off
import random

import pytest
import torch
import transformers

from drift.client import (
    AutoDistributedConfig,
    AutoDistributedSpeculativeModel,
    DistributedLlamaForSpeculativeGeneration,
    RemoteSequential,
)
from tests.compat.petals_refs import MAX_SHORT_INFERENCE_TOKENS, load_pretrained_block
from tests.compat.tiny_tokenizer import tiny_tokenizer

MODEL_NAME = REF_NAME = INITIAL_PEERS = None  # filled per test: tests/compat/conftest.py


def test_remote_block_with_cache_invalidation_exact_match(atol_forward=1e-4, atol_inference=1e-4):
    config = AutoDistributedConfig.from_pretrained(MODEL_NAME, initial_peers=INITIAL_PEERS)
    remote_sequential = RemoteSequential(config)

    block_index = random.randint(0, config.num_hidden_layers - 1)
    remote_block = remote_sequential[block_index]

    inputs = torch.randn(1, MAX_SHORT_INFERENCE_TOKENS - 50, config.hidden_size)
    short_inputs = torch.randn(1, MAX_SHORT_INFERENCE_TOKENS - 50, config.hidden_size)
    short_inputs[:, :2, :] = inputs[:, :2, :]

    initial_outputs_inference = None
    secondary_outputs_inference = None
    with torch.inference_mode():
        with remote_block.inference_session(max_length=inputs.shape[1]) as sess:
            initial_outputs_inference = sess.step(inputs)
            sess.position = 2
            secondary_outputs_inference = sess.step(short_inputs[:, 2:, :])
            result = torch.cat([initial_outputs_inference[:, :2, :], secondary_outputs_inference], dim=1)

    ref_block = load_pretrained_block(MODEL_NAME, block_index, torch_dtype=torch.float32)
    (outputs_local,) = ref_block(short_inputs)

    assert torch.allclose(outputs_local, result, rtol=0, atol=atol_inference)


@pytest.fixture
def noisy_model():
    noisy_model = transformers.AutoModelForCausalLM.from_pretrained(
        REF_NAME, low_cpu_mem_usage=True, torch_dtype=torch.float32
    )
    lm_head = noisy_model.get_output_embeddings()
    assert isinstance(lm_head, torch.nn.Linear)
    with torch.no_grad():
        lm_head.weight += torch.randn_like(lm_head.weight) * 0.02
    return noisy_model


@pytest.fixture
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(
        MODEL_NAME, low_cpu_mem_usage=True, torch_dtype=torch.float32
    )


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


def test_remote_speculative_generation(tokenizer, model, noisy_model, atol_inference=1e-4):
    speculated_distributed_model = AutoDistributedSpeculativeModel.from_pretrained(
        MODEL_NAME, initial_peers=INITIAL_PEERS, torch_dtype=torch.float32, small_model=noisy_model
    )

    inputs_single = tokenizer("A cat sat on a mat", return_tensors="pt")["input_ids"]

    generated_spec = speculated_distributed_model.generate(inputs_single, max_new_tokens=100, do_sample=False)
    generated_local = model.generate(inputs_single, max_new_tokens=100, do_sample=False)

    assert torch.allclose(generated_spec, generated_local, rtol=0, atol=atol_inference)
