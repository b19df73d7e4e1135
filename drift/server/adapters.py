"""Served LoRA adapters: `--adapters` values parsed, their files found, the span's share loaded.

A source (drift.server.config.parse_adapters) is a local peft adapter directory or a Hub
repository id. `load_adapters` reads only the served blocks' weights (drift.models.peft_files) into the
span, checked against its modules. Called when a server loads, and when it moves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from drift.models.peft_files import CONFIG_FILE, WEIGHTS_FILE, read_adapter
from drift.wire.errors import BadRequest

log = logging.getLogger(__name__)


def adapter_dir(source: str, revision: str | None = None) -> Path:
    """A local adapter directory, or the Hub repository `source` fetched (its two files)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or source.count("/") != 1:
        raise BadRequest(f"adapter {source!r} is neither a directory holding {CONFIG_FILE} and "
                         f"{WEIGHTS_FILE} nor a Hub repository id")  # fmt: skip
    from drift.models.sources.hub import _download

    return _download(source, revision, [CONFIG_FILE, WEIGHTS_FILE])


def load_adapters(span: Any, adapters: Iterable[tuple[str, str]]) -> None:
    """Give `span` (drift.models.ModelSpan) each adapter's weights for its blocks."""
    for name, source in adapters:
        directory = adapter_dir(source)
        weights = read_adapter(directory, span.adapter.layer_prefix, span.start_block,
                               span.end_block, dtype=span.dtype)  # fmt: skip
        span.add_adapter(name, weights)
        log.info("serving LoRA adapter %s from %s: %d module(s) in blocks [%d, %d)", name,
                 directory, len(weights) // 2, span.start_block, span.end_block)  # fmt: skip
