"""AutoDistributedConfig: Petals' way to name a swarm's model without loading any weights.

`AutoDistributedConfig.from_pretrained(name, initial_peers=...)` is the checkpoint's
transformers config, carrying what a client needs to reach the swarm: the initial peers
(as given: a join token's `?key=` stays in it, so do not publish such a config) and the
model's fingerprint. `client_for(config)` builds the RemoteClient a `RemoteSequential(config)`
runs on. Reads no tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

from transformers import PretrainedConfig

from drift.client.config import ClientConfig
from drift.client.loading import open_client_checkpoint, parse_peers, sdk_swarm_key
from drift.client.pretrained_args import apply_overrides, drop_ignored
from drift.client.remote import RemoteClient
from drift.models.sharing import KVSharing


class AutoDistributedConfig:
    @classmethod
    def from_pretrained(
        cls, name_or_path: Any, *, initial_peers: Any, cache_dir: Any = None,
        revision: str | None = None, token: str | bool | None = None, **kwargs: Any,
    ) -> PretrainedConfig:  # fmt: skip
        """The text config of `name_or_path` with `initial_peers` and `model_fingerprint`."""
        tokens = parse_peers(initial_peers)  # refused now if they do not parse
        ckpt = open_client_checkpoint(name_or_path, cache_dir=cache_dir, revision=revision,
                                      token=token, initial_peers=tokens)  # fmt: skip
        config = copy.deepcopy(ckpt.config.get_text_config())
        apply_overrides(config, drop_ignored(kwargs))
        config.initial_peers = [t.to_drift(with_key=True) for t in tokens]
        config.model_fingerprint = ckpt.fingerprint
        return config


def client_for(config: PretrainedConfig, client_config: ClientConfig | None = None) -> RemoteClient:
    """A client for a config from AutoDistributedConfig (closed when collected)."""
    peers = getattr(config, "initial_peers", None)
    fingerprint = getattr(config, "model_fingerprint", None)
    if not peers or not isinstance(fingerprint, str):
        raise ValueError(
            "this config does not say where the swarm is: build it with "
            "AutoDistributedConfig.from_pretrained(name, initial_peers=...)"
        )
    tokens = parse_peers(peers)
    settings = client_config or ClientConfig()
    settings = dataclasses.replace(settings, swarm_key=sdk_swarm_key(None, settings, tokens))
    client = RemoteClient(tokens, fingerprint, settings, KVSharing.from_config(config))
    client.adapter_of = functools.partial(getattr, config, "active_adapter", None)  # LoRA
    return client
