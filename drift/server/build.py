"""Building a block server from a ServerConfig: checkpoint, span choice, weights, throughput.

Functions `drift server` and `drift up` both use: `load_server` (torch work, blocking),
`attach_server` (routes on the node's app + first announce), `warn_dtype_mismatch`,
`warn_revision_mismatch`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.devices import parse_dtype, pick_device
from drift.models.memory import resident_bytes, trim_heap
from drift.models.quant import parse_quant, quant_backend, warm_up
from drift.models.registry import get_adapter
from drift.models.span import ModelSpan
from drift.node.runner import BEFORE_STOP
from drift.openmp import worker_release
from drift.server.adapters import load_adapters
from drift.server.backend import SpanBackend
from drift.server.chunks import chunk_tokens_for
from drift.server.compiled import attach_decode
from drift.server.config import ServerConfig
from drift.server.decode_rows import attach_row_pads
from drift.server.decode_threads import attach_decode_threads
from drift.server.handoff import drain
from drift.server.products import attach_row_kernel
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
    device = pick_device(config.device)
    dtype = parse_dtype(config.torch_dtype, device)
    quant = parse_quant(config.quant_type, device)
    if quant != "none":
        quant_backend()  # missing bitsandbytes: fail now, not after minutes of downloads
        if device.type == "cpu":
            log.warning("--quant_type %s on the CPU saves memory, but its matmuls run 1.5-4x "
                        "slower than float32's (bitsandbytes' CPU kernels)", quant)  # fmt: skip
    if ckpt is None:
        ckpt = open_checkpoint(config.model, cache_dir=config.cache_dir,
                               revision=config.revision, dtype=dtype)  # fmt: skip
    num_model_blocks = int(ckpt.config.get_text_config().num_hidden_layers)  # text tower
    same_model = records_for_model(list(records or []), ckpt.fingerprint)
    start, end = resolve_span(config, num_model_blocks, same_model)
    warn_dtype_mismatch(same_model, dtype_name(dtype))
    warn_revision_mismatch(list(records or []), ckpt.name, ckpt.fingerprint)
    log.info("loading %s blocks [%d, %d) as %s (quantization: %s) on %s",
             ckpt.name, start, end, dtype_name(dtype), quant, device)  # fmt: skip
    # RSS before the blocks: freed heap (a conversion's) returned, the family's code imported,
    # bitsandbytes' kernels loaded: what is left to grow is the weights.
    get_adapter(ckpt.config).build_aux()
    warm_up(quant, dtype, device)
    trim_heap()
    before = resident_bytes()
    span = ModelSpan.load(ckpt, start, end, dtype=dtype, device=device, quant=quant,
                          progress=progress)  # fmt: skip
    load_adapters(span, config.adapters)
    products = attach_row_kernel(span, config)
    after = resident_bytes()
    if before is not None and after is not None:
        log.info("weights of blocks [%d, %d) take %.1f MiB resident (RSS %.1f -> %.1f MiB)",
                 start, end, (after - before) / 2**20, before / 2**20, after / 2**20)  # fmt: skip
    # measured (once per device, model, dtype, quantization: cached) even when --throughput
    # announces another figure: it sizes the units of compute-thread work
    key = throughput_key(device, ckpt.fingerprint, dtype, quant)
    pace = cached_throughput(span, key=key, cache_dir=config.cache_dir)
    chunk = config.chunk_tokens or chunk_tokens_for(pace, end - start)
    log.info("compute runs in units of at most %d tokens (%.1f block-tokens/s measured)",
             chunk, pace)  # fmt: skip
    backend = SpanBackend(span, model_name=ckpt.name, fingerprint=ckpt.fingerprint,
                          max_batch_size=config.max_batch_size, quant=quant,
                          max_request_tokens=config.max_request_tokens,
                          chunk_tokens=chunk, pace=pace,
                          sized_by_pace=config.chunk_tokens is None)  # fmt: skip
    attach_decode(backend, config.compile)  # compiled (if so) now: before any user's step
    backend.decode_status["products"] = products
    # this thread's OpenMP pool, left by loading, would have the compute thread's workers spin
    # throttled (drift.openmp) while it measures: 2-thread steps timed 21 ms instead of 13.8
    worker_release()()
    backend.decode_status |= attach_decode_threads(backend, config.decode_threads)
    backend.decode_status |= attach_row_pads(backend)  # on those threads
    throughput = config.throughput if config.throughput is not None else pace
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
        if server.config.drain_timeout_s > 0:  # a graceful stop hands sessions over first
            hook = functools.partial(drain, server, node, server.config.drain_timeout_s)
            app.setdefault(BEFORE_STOP, []).append(hook)
        node.announce(**server.record_fields())
