"""Petals' tests/test_remote_sequential.py (bigscience-workshop/petals, MIT), run against DRIFT.

Changed from Petals' file: the imports (DRIFT's AutoDistributedConfig and RemoteSequential;
Petals' load_pretrained_block rebuilt on plain transformers in tests/compat/petals_refs.py;
Petals' test_utils globals are placeholders that tests/compat/conftest.py fills with a tiny
llama checkpoint and a fresh swarm); every tolerance is DRIFT's 1e-4 (Petals': 1e-3 to
3e-2); @pytest.mark.forked dropped. Beyond imports: there is no DHT to start (the
`dht = DHT(...)` line and `dht=dht` go: RemoteSequential(config) finds the swarm from the
config's initial peers), and the lossy-compression half of the first test (a custom
hivemind sequence manager) is not run: DRIFT's compression is its own (issue 14).
"""

# Petals' own code and formatting, so that the file compares line by line with Petals':
# ruff: noqa: F401, F541, B905
# fmt: off
import logging

import pytest
import torch
import torch.nn.functional as F

from drift.client import AutoDistributedConfig, RemoteSequential
from tests.compat.petals_refs import load_pretrained_block

MODEL_NAME = REF_NAME = INITIAL_PEERS = None  # filled per test: tests/compat/conftest.py

logger = logging.getLogger(__name__)


def test_remote_sequential():
    config = AutoDistributedConfig.from_pretrained(MODEL_NAME, initial_peers=INITIAL_PEERS)
    test_inputs = torch.randn(1, 5, config.hidden_size, requires_grad=True)
    grad_proj = torch.randn(1, 5, config.hidden_size)

    sequential = RemoteSequential(config)

    full_outputs = sequential(test_inputs)
    (full_outputs * grad_proj).sum().backward()
    assert test_inputs.grad is not None
    full_grad = test_inputs.grad.clone()
    test_inputs.grad.data.zero_()

    first_half = sequential[: config.num_hidden_layers // 2]
    second_half = sequential[config.num_hidden_layers // 2 :]
    assert len(first_half) + len(second_half) == len(sequential)
    assert abs(len(first_half) - len(second_half)) == config.num_hidden_layers % 2
    for m in sequential, first_half, second_half:
        assert isinstance(repr(m), str)

    hidden = first_half(test_inputs)
    assert isinstance(hidden, torch.Tensor)
    assert hidden.shape == test_inputs.shape
    assert hidden.requires_grad
    second_half_outputs = second_half(hidden)
    assert torch.allclose(second_half_outputs, full_outputs, atol=1e-4)

    (second_half_outputs * grad_proj).sum().backward()
    assert torch.allclose(test_inputs.grad, full_grad, atol=1e-4)


def test_remote_sequential_prompts(batch_size=2, seq_len=5, pre_seq_len=3):
    config = AutoDistributedConfig.from_pretrained(MODEL_NAME, initial_peers=INITIAL_PEERS)
    remote_sequential = RemoteSequential(config)

    inputs = F.normalize(torch.randn(batch_size, seq_len, config.hidden_size), dim=-1)
    output_proj = F.normalize(torch.randn(batch_size, seq_len + pre_seq_len, config.hidden_size), dim=-1)
    input_prompts = F.normalize(torch.randn(batch_size, pre_seq_len, config.hidden_size, requires_grad=True), dim=-1)
    intermediate_prompts = torch.randn(
        config.num_hidden_layers, batch_size, pre_seq_len, config.hidden_size, requires_grad=True
    )

    input_prompts = input_prompts.detach().requires_grad_(True)
    intermediate_prompts = intermediate_prompts.detach().requires_grad_(True)

    inputs_with_prompts = torch.cat([inputs, input_prompts], dim=1)
    assert inputs_with_prompts.shape == (batch_size, seq_len + pre_seq_len, config.hidden_size)

    outputs = remote_sequential(inputs_with_prompts, prompts=intermediate_prompts)

    (outputs * output_proj).sum().backward()
    assert intermediate_prompts.grad is not None

    input_prompts_ref = input_prompts.clone().detach().requires_grad_(True)
    intermediate_prompts_ref = intermediate_prompts.clone().detach().requires_grad_(True)

    assert input_prompts_ref.grad is None
    assert intermediate_prompts_ref.grad is None

    outputs_ref = torch.cat([inputs, input_prompts_ref], dim=1)
    for block_index in range(config.num_hidden_layers):
        block_prompt = intermediate_prompts_ref[block_index]
        outputs_ref[:, : block_prompt.shape[1]] += block_prompt

        block = load_pretrained_block(MODEL_NAME, block_index=block_index, torch_dtype=torch.float32)
        (outputs_ref,) = block(outputs_ref)

    assert torch.allclose(outputs_ref, outputs, atol=1e-4)

    (outputs_ref * output_proj).sum().backward()
    assert input_prompts_ref.grad is not None
    assert torch.allclose(input_prompts_ref.grad, input_prompts.grad, atol=1e-4)
    assert intermediate_prompts_ref.grad is not None
    assert torch.allclose(intermediate_prompts_ref.grad, intermediate_prompts.grad, atol=1e-4)
