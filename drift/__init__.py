"""DRIFT: run one large language model across a private cluster of your own machines.

The package root stays light (no torch import) so `drift dht` and the CLI start fast;
the SDK classes load on first use.
"""

from __future__ import annotations

from typing import Any

from drift.wire.version import PROTOCOL_VERSION, __version__

__all__ = ["PROTOCOL_VERSION", "__version__"]

_SDK_NAMES = {
    "AutoDistributedConfig",
    "AutoDistributedModelForCausalLM",
    "AutoDistributedModelForSequenceClassification",
    "AutoDistributedSpeculativeModel",
    "DistributedLlamaForCausalLM",
    "DistributedLlamaForSpeculativeGeneration",
    "RemoteSequential",
    "InferenceSession",
    "DistributedModelForCausalLM",
    "ClientConfig",
    "load_tokenizer",
}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from drift import client

        return getattr(client, name)
    raise AttributeError(f"module 'drift' has no attribute {name!r}")
