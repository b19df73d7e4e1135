"""peft's LoRA adapter files, read and written without peft.

An adapter directory holds `adapter_config.json` and `adapter_model.safetensors`, whose keys
are `base_model.model.<module name>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r].
`read_adapter` loads only the blocks a server holds (safe_open), as wire-named weights
(drift.wire.lora) with peft's scaling folded into B; `write_adapter` writes a set that plain
peft loads. Refuses what it cannot apply exactly (DoRA, biases, modules_to_save, ...).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from drift.wire.errors import BadRequest
from drift.wire.lora import lora_name, parse_lora_name

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."
_UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none"}


@dataclass(frozen=True)
class AdapterSettings:
    """The parts of an adapter_config.json that decide its numbers."""

    r: int
    lora_alpha: float
    target_modules: Any  # list of names, or a regex string
    use_rslora: bool = False
    alpha_pattern: Mapping[str, float] | None = None
    rank_pattern: Mapping[str, int] | None = None

    def scale(self, full_name: str, rank: int) -> float:
        """peft's scaling of one module: alpha / r (or alpha / sqrt(r) with rsLoRA)."""
        alpha = self.lora_alpha
        for pattern, value in (self.alpha_pattern or {}).items():
            if re.match(rf"(.*\.)?{pattern}$", full_name):
                alpha = value
                break
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def read_settings(directory: Path) -> AdapterSettings:
    path = directory / CONFIG_FILE
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadRequest(f"cannot read the LoRA adapter config {path}: {exc}") from exc
    if cfg.get("peft_type", "LORA") != "LORA":
        raise BadRequest(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, default in _UNSUPPORTED.items():
        if cfg.get(key, default) != default:
            raise BadRequest(f"{path}: {key}={cfg[key]!r} is not supported (only {default!r})")
    if cfg.get("modules_to_save"):
        raise BadRequest(f"{path}: modules_to_save {cfg['modules_to_save']} would replace "
                         "whole modules; DRIFT serves only LoRA weights")  # fmt: skip
    try:
        return AdapterSettings(int(cfg["r"]), float(cfg["lora_alpha"]), cfg.get("target_modules"),
                               bool(cfg.get("use_rslora", False)), cfg.get("alpha_pattern") or {},
                               cfg.get("rank_pattern") or {})  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"{path}: r and lora_alpha must be numbers ({exc})") from exc


def _key_pattern(layer_prefix: str) -> re.Pattern[str]:
    """`base_model.model.model.layers.<i>.<module>.lora_<A|B>.weight` for layer_prefix
    "model.layers.{i}."."""
    before, after = layer_prefix.split("{i}")
    return re.compile(
        re.escape(KEY_PREFIX + before) + r"(\d+)" + re.escape(after) + r"(.+)\.lora_([AB])\.weight"
    )


def read_adapter(directory: Path, layer_prefix: str, start: int, end: int, *,
                 dtype: torch.dtype = torch.float32,
                 scaled: bool = True) -> dict[str, torch.Tensor]:  # fmt: skip
    """The adapter's weights for blocks [start, end), wire-named, scaling folded into B
    (`scaled=False`: B as stored, e.g. to go on training it)."""
    settings = read_settings(directory)
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise BadRequest(f"{directory} has no {WEIGHTS_FILE} (DRIFT never loads pickle files)")
    pattern = _key_pattern(layer_prefix)
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            match = pattern.fullmatch(key)
            if match is None:
                if ".lora_" in key and "layers" not in key and ".h." not in key:
                    raise BadRequest(f"{path}: {key} adapts a module outside the blocks")
                continue
            block, module, part = int(match[1]), match[2], match[3]
            if start <= block < end:
                out[lora_name(block, module, part)] = f.get_tensor(key).to(torch.float32)
    for name in [n for n in out if n.endswith(".B")]:
        a = out.get(name[:-1] + "A")
        if a is None:
            raise BadRequest(f"{path}: {name} has no lora_A beside it")
        block, module, _ = parse_lora_name(name) or (0, "", "")
        full = layer_prefix.format(i=block) + module
        if scaled:
            out[name] = out[name] * settings.scale(full, a.shape[0])
    return {k: v.to(dtype) for k, v in out.items()}


def write_adapter(directory: Path, weights: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                  config: Mapping[str, Any]) -> None:  # fmt: skip
    """Write peft's two files: `weights` maps full module names to (A, B) unscaled, `config`
    is adapter_config.json's content (peft_type, r, lora_alpha, target_modules, ...)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for full_name, (a, b) in weights.items():
        tensors[f"{KEY_PREFIX}{full_name}.lora_A.weight"] = a.detach().to("cpu").contiguous()
        tensors[f"{KEY_PREFIX}{full_name}.lora_B.weight"] = b.detach().to("cpu").contiguous()
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
