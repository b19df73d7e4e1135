"""Served LoRA adapters: `--adapters` values parsed, their files found, the span's share loaded.

`parse_adapters` turns `NAME=PATH` or `PATH` (named by its last path component) into
(name, source) pairs; a source is a local peft adapter directory or a Hub repository id.
`load_adapters` reads only the served blocks' weights (drift.models.peft_files) into the
span, checked against its modules. Called when a server loads, and when it moves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from drift.models.peft_files import CONFIG_FILE, WEIGHTS_FILE, read_adapter
from drift.wire.errors import BadRequest
from drift.wire.lora import check_adapter_names

log = logging.getLogger(__name__)


def parse_adapters(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`NAME=PATH_OR_HUB_ID` or `PATH_OR_HUB_ID` -> (name, source); ValueError if bad."""
    pairs = []
    for value in values:
        name, sep, source = value.partition("=")
        if not sep:
            source, name = value, Path(value.rstrip("/")).name
        if not source:
            raise ValueError(f"--adapters {value!r}: give NAME=PATH or PATH")
        pairs.append((name, source))
    check_adapter_names(name for name, _ in pairs)
    return tuple(pairs)


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
