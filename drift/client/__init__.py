"""The DRIFT client SDK: use a model served by a swarm like a local transformers model.

Swarm view, routing, RemoteSequential, InferenceSession with failover, HF-compatible
distributed models and prompt tuning. Import the classes from here (or lazily from drift).
"""

from __future__ import annotations

from drift.client.auto import (
    AutoDistributedModelForCausalLM,
    AutoDistributedModelForSequenceClassification,
    AutoDistributedSpeculativeModel,
    DistributedLlamaForCausalLM,
    DistributedLlamaForSpeculativeGeneration,
)
from drift.client.config import ClientConfig
from drift.client.distributed_config import AutoDistributedConfig
from drift.client.loading import load_tokenizer
from drift.client.model import DistributedModelForCausalLM
from drift.client.sequential import RemoteSequential
from drift.client.session import InferenceSession

__all__ = [
    "AutoDistributedConfig",
    "AutoDistributedModelForCausalLM",
    "AutoDistributedModelForSequenceClassification",
    "AutoDistributedSpeculativeModel",
    "ClientConfig",
    "DistributedLlamaForCausalLM",
    "DistributedLlamaForSpeculativeGeneration",
    "DistributedModelForCausalLM",
    "InferenceSession",
    "RemoteSequential",
    "load_tokenizer",
]
