"""Convert a GGUF file once into a cached safetensors checkpoint directory of a given dtype.

Config, tokenizer and generation config come from transformers' GGUF parser; the tensors are
streamed one at a time (gguf_tensors), so converting needs about one tensor of memory, not the
model. Everything is written to a temporary directory renamed into place, so a crash never
leaves a half cache. The cache key is the file's name, size and mtime plus the dtype: a later
open reads nothing of the GGUF. Quantized GGUF blocks (Q4_K, ...) are dequantized here.
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
from typing import cast

import torch

from drift.wire.errors import BadRequest, NotFound

from .gguf_tensors import write_gguf_tensors

log = logging.getLogger(__name__)

SOURCE_FILE = "drift_source.json"
DEFAULT_DTYPE = torch.bfloat16  # what a GGUF converts to when no run dtype is given
# Conversions an open without a dtype (config and tokenizer only) reuses, in this order.
REUSE_ORDER = (torch.bfloat16, torch.float32, torch.float16)
_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def gguf_cache_path(gguf: Path, cache_dir: Path, dtype: torch.dtype = DEFAULT_DTYPE) -> Path:
    """The cache directory for `gguf` converted to `dtype`, keyed by name, size, mtime, dtype."""
    if dtype not in _NAMES:
        raise BadRequest(f"cannot convert a GGUF to {dtype}; use float32, bfloat16 or float16")
    stat = gguf.stat()
    text = f"{gguf.name}|{stat.st_size}|{stat.st_mtime_ns}|{_NAMES[dtype]}"
    key = hashlib.sha256(text.encode()).hexdigest()
    return cache_dir / "gguf" / f"{gguf.stem}-{_NAMES[dtype]}-{key[:16]}"


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


def _convert_into(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Write config, tokenizer and the tensors (streamed, in `dtype`) of `gguf` into `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
        # transformers' stub types the lazy mapping's values as tuples; they are classes.
        lm_class = cast(type, AutoModelForCausalLM._model_mapping[type(config)])
    except Exception as exc:  # unsupported architecture, corrupt or truncated file
        raise BadRequest(f"cannot load GGUF file {gguf} with transformers: {exc}") from exc
    if hasattr(config, "quantization_config"):  # the tensors are written plain
        del config.quantization_config
    config.architectures = [lm_class.__name__]
    config.dtype = _NAMES[dtype]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(out)
    del tokenizer
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    try:
        count = write_gguf_tensors(gguf, config, parsed, out / "model.safetensors", dtype)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise BadRequest(f"cannot convert the tensors of GGUF file {gguf}: {exc}") from exc
    log.info("GGUF %s: wrote %d tensors as %s", gguf.name, count, _NAMES[dtype])


def find_conversion(gguf: Path, cache_dir: Path) -> Path | None:
    """An existing conversion of `gguf` in any dtype (REUSE_ORDER), or None."""
    for dtype in REUSE_ORDER:
        target = gguf_cache_path(gguf, cache_dir, dtype)
        if (target / "config.json").is_file():
            return target
    return None


def convert_gguf(gguf: Path, cache_dir: Path, dtype: torch.dtype | None = None) -> Path:
    """The cached safetensors directory for `gguf` in `dtype`, converting it first if needed.

    `dtype` None (a caller that needs only config and tokenizer): any existing conversion,
    else a DEFAULT_DTYPE one.
    """
    if not gguf.is_file():
        raise NotFound(f"GGUF file {gguf} does not exist")
    if dtype is None:
        found = find_conversion(gguf, cache_dir)
        if found is not None:
            return found
    target = gguf_cache_path(gguf, cache_dir, dtype or DEFAULT_DTYPE)
    if (target / "config.json").is_file():
        log.debug("GGUF %s: using cached conversion %s", gguf.name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    log.info("GGUF %s (%.0f MB): converting once to %s", gguf, gguf.stat().st_size / 2**20, target)
    try:
        tmp.mkdir()
        _convert_into(gguf, tmp, dtype or DEFAULT_DTYPE)
        log.info("GGUF %s: hashing the source file", gguf.name)
        source = {
            "gguf_file": gguf.name,
            "size": gguf.stat().st_size,
            "dtype": _NAMES[dtype or DEFAULT_DTYPE],
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
