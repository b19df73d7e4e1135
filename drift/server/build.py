"""Building a block server from a ServerConfig: checkpoint, span choice, weights, throughput.

Functions `drift server` and `drift up` both use: `load_server` (torch work, blocking),
`attach_server` (routes on the node's app + first announce), `warn_dtype_mismatch`,
`warn_revision_mismatch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.devices import parse_dtype, pick_device
from drift.models.span import ModelSpan
from drift.server.backend import SpanBackend
from drift.server.config import ServerConfig
from drift.server.routes import add_server_routes
from drift.server.state import BlockServer
from drift.server.throughput import cached_throughput, throughput_key
from drift.swarm.coverage import records_for_model
from drift.swarm.selection import choose_span
from drift.wire.checks import dtype_name
from drift.wire.errors import BadRequest

log = logging.getLogger(__name__)


def resolve_span(
    config: ServerConfig, num_model_blocks: int, records: list[Any]
) -> tuple[int, int]:
    """Pinned [start_block, end_block), or num_blocks where the swarm is weakest."""
    if config.start_block is not None or config.end_block is not None:
        start = 0 if config.start_block is None else config.start_block
        end = num_model_blocks if config.end_block is None else config.end_block
        if not 0 <= start < end <= num_model_blocks:
            raise BadRequest(
                f"block indices {start}:{end} are outside the model's {num_model_blocks} blocks"
            )
        return start, end
    n_blocks = num_model_blocks if config.num_blocks is None else config.num_blocks
    if not 0 < n_blocks <= num_model_blocks:
        raise BadRequest(f"--num_blocks {n_blocks} must lie in [1, {num_model_blocks}]")
    return choose_span(records, num_model_blocks, n_blocks)


def load_server(
    config: ServerConfig,
    *,
    records: list[Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    ckpt: Checkpoint | None = None,
) -> BlockServer:
    """Open the checkpoint (unless given), load this server's blocks, measure (or take) its
    throughput. `progress(done, total)` is called after each block is loaded.
    """
    if ckpt is None:
        ckpt = open_checkpoint(config.model, cache_dir=config.cache_dir, revision=config.revision)
    num_model_blocks = int(ckpt.config.num_hidden_layers)
    same_model = records_for_model(list(records or []), ckpt.fingerprint)
    start, end = resolve_span(config, num_model_blocks, same_model)
    device = pick_device(config.device)
    dtype = parse_dtype(config.torch_dtype, device)
    warn_dtype_mismatch(same_model, dtype_name(dtype))
    warn_revision_mismatch(list(records or []), ckpt.name, ckpt.fingerprint)
    log.info("loading %s blocks [%d, %d) as %s on %s", ckpt.name, start, end, dtype, device)
    span = ModelSpan.load(ckpt, start, end, dtype=dtype, device=device, progress=progress)
    backend = SpanBackend(span, model_name=ckpt.name, fingerprint=ckpt.fingerprint,
                          max_batch_size=config.max_batch_size,
                          max_request_tokens=config.max_request_tokens,
                          chunk_tokens=config.chunk_tokens)  # fmt: skip
    throughput = config.throughput
    if throughput is None:
        key = throughput_key(device, ckpt.fingerprint, dtype, backend.quant)
        throughput = cached_throughput(span, key=key, cache_dir=config.cache_dir)
    return BlockServer(config, backend, throughput=throughput)


def warn_dtype_mismatch(records: list[Any], dtype: str) -> list[str]:
    """Log (and return) the peers serving this model in another dtype."""
    others = [r.peer_id for r in records if r.dtype is not None and r.dtype != dtype]
    if others:
        log.warning(
            "%d peer(s) serve this model in another dtype than %s (%s): outputs may differ "
            "slightly between routes", len(others), dtype, ", ".join(p[:16] for p in others),
        )  # fmt: skip
    return others


def warn_revision_mismatch(records: list[Any], name: str, fingerprint: str) -> list[str]:
    """Log (and return) the peers serving a model of this name with another fingerprint.

    Such peers never join this server's chains (routing matches fingerprints), so a swarm
    split between two revisions of one checkpoint has two half-covered models.
    """
    others = [r.peer_id for r in records
              if r.model == name and r.model_fingerprint not in (None, fingerprint)]  # fmt: skip
    if others:
        log.warning(
            "%d peer(s) serve %s with another config or revision (%s): they cannot share "
            "chains with this server", len(others), name, ", ".join(p[:16] for p in others),
        )  # fmt: skip
    return others


def attach_server(app: web.Application, server: BlockServer, node: Any | None) -> None:
    """Add the compute routes to the node's app and announce the span (when in a swarm)."""
    add_server_routes(app, server)
    if node is not None:
        server.announce = node.announce
        node.announce(**server.record_fields())
