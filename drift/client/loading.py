"""What every distributed model class loads: checkpoint, client head, swarm client.

Resolves the model a user names through drift.client.resolve (a local path or alias, a Hub
id, else the client parts the swarm serves under that name, reading only the client's
tensors), accepts dtype= and the older torch_dtype= ("auto": the checkpoint's), device= for
the client's own parts, and parses initial peers (join tokens or multiaddrs, with an
optional swarm key). A local model the swarm does not serve is refused at once, both named.
`load_tokenizer` gives the tokenizer for the same names.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from drift.client.config import ClientConfig
from drift.client.remote import RemoteClient
from drift.client.resolve import Resolved, check_served, open_model
from drift.identity.swarm_key import resolve_swarm_key
from drift.identity.tokens import JoinToken, parse_join_tokens
from drift.wire.checks import ACTIVATION_DTYPES
from drift.wire.errors import DriftError, ModelMismatch

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from drift.models.checkpoint import Checkpoint
    from drift.models.head import ClientHead


def resolve_dtype(dtype: Any, torch_dtype: Any, config: Any = None) -> torch.dtype:
    """The activation dtype: float32 by default; "auto" is the config's when it is one."""
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; give one")
    value = dtype if dtype is not None else torch_dtype
    if value == "auto":
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        value = (
            stored if stored in ACTIVATION_DTYPES or stored in ACTIVATION_DTYPES.values() else None
        )
    if value is None:
        return torch.float32
    if isinstance(value, str):
        value = ACTIVATION_DTYPES.get(value.removeprefix("torch."))
    if value not in ACTIVATION_DTYPES.values():
        raise ValueError(
            f"dtype must be one of {list(ACTIVATION_DTYPES)}, got {dtype or torch_dtype!r}"
        )
    return value


def parse_peers(initial_peers: Any) -> tuple[JoinToken, ...]:
    if initial_peers is None or (not isinstance(initial_peers, str) and not initial_peers):
        raise ValueError(
            "initial_peers is required: a join token 'drift://<peer_id>@host:port' or a "
            "multiaddr '/ip4/<host>/tcp/<port>/p2p/<peer_id>' (or a list of them)"
        )
    items = [initial_peers] if isinstance(initial_peers, str | JoinToken) else list(initial_peers)
    tokens = tuple(
        t
        for item in items
        for t in ((item,) if isinstance(item, JoinToken) else parse_join_tokens(item))
    )
    return tokens


def sdk_swarm_key(swarm_key: str | None, config: ClientConfig | None,
                  tokens: tuple[JoinToken, ...]) -> str | None:  # fmt: skip
    """The SDK's key: swarm_key= or client_config's (ValueError when both, differing), else a
    token's ?key= -- drift.identity.swarm_key.resolve_swarm_key, once per load."""
    given = config.swarm_key if config is not None else None
    if swarm_key and given and swarm_key != given:
        raise ValueError("swarm_key= and client_config.swarm_key disagree; give one")
    return resolve_swarm_key(swarm_key or given, tokens=tokens)


def open_client_model(name_or_path: Any, *, cache_dir: Any = None,
                      revision: str | None = None, dtype: torch.dtype | None = None,
                      token: str | bool | None = None, initial_peers: Any = None,
                      swarm_key: str | None = None) -> Resolved:  # fmt: skip
    """The model as a client needs it (no block weights fetched; a GGUF converts to `dtype`,
    the client's), with where it came from: drift.client.resolve.open_model, given the
    parsed peers. One already opened is passed through, so a from_pretrained chain opens it
    once. `token`: the Hub's."""
    peers = () if _no_peers(initial_peers) else parse_peers(initial_peers)
    key = sdk_swarm_key(swarm_key, None, peers)
    return open_model(name_or_path, initial_peers=peers, swarm_key=key,
                      cache_dir=cache_dir, revision=revision, dtype=dtype, token=token)  # fmt: skip


def open_client_checkpoint(name_or_path: Any, **kwargs: Any) -> Checkpoint:
    """open_client_model's checkpoint alone."""
    return open_client_model(name_or_path, **kwargs).ckpt


def _no_peers(initial_peers: Any) -> bool:
    return initial_peers is None or (not isinstance(initial_peers, str) and not initial_peers)


def install_row_kernel(head: torch.nn.Module, cache_dir: Path | None) -> None:
    """The head's float32 CPU linears (lm_head) compute a step's few rows on DRIFT's C kernel
    (drift.models.row_kernel), built into the cache directory; torch's BLAS where it cannot
    be built (logged once) or the head is not float32 on the CPU."""
    from drift.models.row_kernel import install_built
    from drift.paths import resolve_cache_dir

    weight = getattr(getattr(head, "lm_head", None), "weight", None)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return
    count, why = install_built(head, resolve_cache_dir(cache_dir))
    if count is None:
        log.info("%s", why)


def load_parts(
    name_or_path: Any, *, initial_peers: Any, swarm_key: str | None = None,
    dtype: Any = None, torch_dtype: Any = None, client_config: ClientConfig | None = None,
    cache_dir: Path | None = None, revision: str | None = None, device: Any = None,
    token: str | bool | None = None,
) -> tuple[Checkpoint, ClientHead, RemoteClient, torch.dtype]:  # fmt: skip
    """(checkpoint, ClientHead, RemoteClient, dtype) for a model name, path, Checkpoint or
    Resolved; the head on `device` (drift.models.devices.pick_device's names; default cpu).
    ModelMismatch when the swarm answers and serves other models but not this one."""
    from drift.models.devices import pick_device
    from drift.models.head import ClientHead

    tokens = parse_peers(initial_peers)
    config = client_config or ClientConfig()
    key = sdk_swarm_key(swarm_key, config, tokens)
    config = dataclasses.replace(config, swarm_key=key)  # every layer below reads this one
    where = pick_device("cpu" if device is None else str(device))
    gguf_dtype = resolve_dtype(dtype, torch_dtype, None)  # a GGUF converts once, to it
    resolved = open_model(name_or_path, initial_peers=tokens, swarm_key=key, cache_dir=cache_dir,
                          revision=revision, dtype=gguf_dtype, token=token)  # fmt: skip
    ckpt = resolved.ckpt
    torch_dt = resolve_dtype(dtype, torch_dtype, ckpt.config)
    head = ClientHead.load(ckpt, dtype=torch_dt, device=where)
    if config.row_kernel:
        install_row_kernel(head, cache_dir)
    client = RemoteClient(tokens, ckpt.fingerprint, config, head.sharing)
    client.origin = resolved.origin
    if resolved.fetched is None:  # a model of this machine: is it the swarm's?
        try:
            client.run(client.swarm.refresh())
        except DriftError:
            pass  # unreachable or refused now: the first request says why
        else:
            try:
                check_served(resolved.origin, client.swarm.table.live(time.time()))
            except ModelMismatch:
                client.close()
                raise
    return ckpt, head, client, torch_dt


def load_tokenizer(
    name_or_path: str | Path | None = None, *, initial_peers: Any = None,
    swarm_key: str | None = None, cache_dir: str | Path | None = None,
    revision: str | None = None,
) -> Any:  # fmt: skip
    """The tokenizer for a model alias ("smollm2"), model dir, .gguf file or Hub id, or (with
    `initial_peers`) for the model the swarm serves under that name (or its only model when
    the name is left out), downloaded from its servers once and cached.

    Resolved like the model itself (drift.client.resolve, no block weights read), so
    `load_tokenizer(name, initial_peers=...)` pairs with `from_pretrained(name,
    initial_peers=...)`: a GGUF not converted yet converts in the SDK's default dtype, the
    one from_pretrained then reuses.
    """
    resolved = open_client_model(name_or_path, cache_dir=cache_dir, revision=revision,
                                 dtype=resolve_dtype(None, None), initial_peers=initial_peers,
                                 swarm_key=swarm_key)  # fmt: skip
    return resolved.ckpt.tokenizer()
