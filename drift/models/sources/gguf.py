"""Convert a GGUF file once into a cached safetensors checkpoint directory.

The GGUF is loaded with transformers (dequantized to float32), its quantizer markers are
cleared, and config + model.safetensors + tokenizer are written to a temporary directory
that is renamed into place, so a crash never leaves a half cache. The cache key is the
file's name, size and mtime: a later open reads nothing of the GGUF.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from drift.wire.errors import BadRequest, NotFound

log = logging.getLogger(__name__)

SOURCE_FILE = "drift_source.json"


def gguf_cache_path(gguf: Path, cache_dir: Path) -> Path:
    """The cache directory for `gguf`, keyed by its name, size and mtime."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_dir / "gguf" / f"{gguf.stem}-{key[:16]}"


def cached_revision(directory: Path) -> str | None:
    """The revision recorded at conversion ("gguf-sha256:<hex>"), or None."""
    try:
        return str(json.loads((directory / SOURCE_FILE).read_text())["revision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _convert_into(gguf: Path, out: Path) -> None:
    """Load `gguf` with transformers (dequantized) and save it as a safetensors dir in `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # unsupported architecture, corrupt or truncated file
        raise BadRequest(f"cannot load GGUF file {gguf} with transformers: {exc}") from exc
    # The tensors are already plain float32: drop the quantizer markers so save_pretrained works.
    # PreTrainedModel sets hf_quantizer at load time but does not declare it (mypy sees
    # nn.Module.__getattr__'s Tensor | Module)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    log.info(
        "GGUF %s: %.1fM parameters, saving safetensors", gguf.name, model.num_parameters() / 1e6
    )
    model.save_pretrained(out, safe_serialization=True)
    del model
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(out)


def convert_gguf(gguf: Path, cache_dir: Path) -> Path:
    """The cached safetensors directory for `gguf`, converting it first if needed."""
    if not gguf.is_file():
        raise NotFound(f"GGUF file {gguf} does not exist")
    target = gguf_cache_path(gguf, cache_dir)
    if (target / "config.json").is_file():
        log.debug("GGUF %s: using cached conversion %s", gguf.name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    log.info("GGUF %s (%.0f MB): converting once to %s", gguf, gguf.stat().st_size / 2**20, target)
    try:
        tmp.mkdir()
        _convert_into(gguf, tmp)
        log.info("GGUF %s: hashing the source file", gguf.name)
        source = {
            "gguf_file": gguf.name,
            "size": gguf.stat().st_size,
            "revision": f"gguf-sha256:{_sha256_file(gguf)}",
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion winning
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("GGUF %s: converted in %.1f s", gguf.name, time.monotonic() - started)
    return target


def find_single_gguf(directory: Path) -> Path | None:
    """The only .gguf file in `directory`, None if there is none; BadRequest if several."""
    found = sorted(directory.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise BadRequest(f"{directory} holds several GGUF files ({names}); name one of them")
    return found[0] if found else None
