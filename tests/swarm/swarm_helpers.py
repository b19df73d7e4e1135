"""Helpers to build signed records for swarm tests."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from drift.identity import Identity
from drift.swarm import PeerRecord, default_fields, sign_record

NOW = 1_000_000.0


def make_record(
    ident: Identity | None = None,
    *,
    span: tuple[int, int] | None = None,
    throughput: float = 1.0,
    num_blocks: int = 8,
    seq: int = 1,
    state: str = "online",
    model: str = "tiny",
    fingerprint: str = "f00d",
    expires_at: float = NOW + 60,
    **extra: Any,
) -> PeerRecord:
    ident = ident or Identity.generate()
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:1"], "0.1.0")
    fields.update(seq=seq, state=state, expires_at=expires_at, throughput=throughput)
    if span is not None:
        fields.update(
            role="server",
            model=model,
            model_fingerprint=fingerprint,
            num_blocks=num_blocks,
            start_block=span[0],
            end_block=span[1],
            dtype="float32",
            quant="none",
        )
    fields.update(extra)
    return sign_record(ident, fields)


def previous_record_module(commit: str, tmp_path: Path, lacks: str) -> ModuleType:
    """drift/swarm/record.py as of `commit` (a version before a field; its source must not
    contain `lacks`), loaded beside this one, to check what older peers make of new records."""
    src = subprocess.run(["git", "show", f"{commit}:drift/swarm/record.py"], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[2]).stdout  # fmt: skip
    assert lacks not in src
    name = f"record_at_{commit}"
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
