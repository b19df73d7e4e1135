"""Which engine a CPU server's few-row float32 products run on: DRIFT's C kernel
(drift.models.row_kernel), built at start-up into the cache directory, or torch's BLAS where it
cannot be built or `--row_kernel off`. /blocks shows the choice under decode.products."""

from __future__ import annotations

import logging

import torch

from drift.models.row_kernel import install_built
from drift.models.span import ModelSpan
from drift.paths import resolve_cache_dir
from drift.server.config import ServerConfig

log = logging.getLogger(__name__)


def attach_row_kernel(span: ModelSpan, config: ServerConfig) -> str:
    """The span's float32 CPU linears compute few-row products on DRIFT's C kernel
    (drift.models.row_kernel), built into the cache directory, unless `config.row_kernel` is
    off; returns what /blocks shows: the products' engine, or why torch's."""
    if not config.row_kernel:
        return "torch's BLAS (--row_kernel off)"
    if span.device.type != "cpu" or span.dtype != torch.float32:
        return "torch's (not float32 on the CPU)"
    if config.compile == "on":  # inductor compiles the decode steps' products instead
        return "torch's (--compile on: decode steps are compiled)"
    count, why = install_built(span.layers, resolve_cache_dir(config.cache_dir))
    if count is None:
        log.warning("%s", why)
        return why
    log.info("%d linear layers compute few-row products on %s", count, why)
    return why if count else "torch's (no float32 linear layers)"
