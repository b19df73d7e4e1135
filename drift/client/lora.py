"""LoRA trained by the client: A and B for the targeted linear modules of every remote block.

The weights live here as parameters; the servers hold none of them between requests (each
/forward and /backward carries the blocks' A and scaled B as named tensors, and /backward
returns their gradients), so an ordinary optimizer trains them. `LoraSettings` takes what
peft's LoraConfig says (r, lora_alpha, target_modules, ...), from a peft object, a dict or
keywords; the targets are found on the family's own layers built on `meta`. `save` writes a
peft adapter (drift.models.peft_files) that plain peft and `drift server --adapters` read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drift.models.lora import lora_targets, matches
from drift.models.peft_files import read_adapter, read_settings, write_adapter
from drift.models.registry import get_adapter
from drift.wire.lora import LoraTarget, lora_name

DEFAULT_TARGETS = ("q_proj", "v_proj")


@dataclass(frozen=True)
class LoraSettings:
    """peft's LoraConfig fields that DRIFT trains with (dropout must be 0: the servers apply
    the weights and a dropout mask would have to travel too)."""

    r: int = 8  # rank
    lora_alpha: float = 8.0  # scaling alpha / r (alpha / sqrt(r) with use_rslora)
    target_modules: tuple[str, ...] | str = DEFAULT_TARGETS  # peft's names or a regex
    lora_dropout: float = 0.0
    use_rslora: bool = False

    @classmethod
    def parse(cls, config: Any) -> LoraSettings:
        """From a LoraSettings, a peft LoraConfig (read by attribute, peft not imported), a
        dict of its fields (`alpha` and `dropout` accepted as short names) or a saved
        adapter's directory (its adapter_config.json)."""
        if isinstance(config, LoraSettings):
            return config
        if isinstance(config, str | Path):
            saved = read_settings(Path(config))
            if saved.alpha_pattern or saved.rank_pattern:
                raise ValueError(f"{config}: rank_pattern / alpha_pattern adapters cannot be "
                                 "trained through the swarm (they can be served)")  # fmt: skip
            config = {"r": saved.r, "lora_alpha": saved.lora_alpha,
                      "target_modules": saved.target_modules, "use_rslora": saved.use_rslora}  # fmt: skip
        fields = dict(config) if isinstance(config, Mapping) else _peft_fields(config)
        fields.setdefault("lora_alpha", fields.pop("alpha", 8.0))
        fields.setdefault("lora_dropout", fields.pop("dropout", 0.0))
        targets = fields.get("target_modules") or DEFAULT_TARGETS
        settings = cls(int(fields.get("r", 8)), float(fields["lora_alpha"]),
                       targets if isinstance(targets, str) else tuple(sorted(targets)),
                       float(fields["lora_dropout"]), bool(fields.get("use_rslora", False)))  # fmt: skip
        if settings.r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {settings.r}")
        if settings.lora_dropout:
            raise ValueError("lora_dropout must be 0 for LoRA trained through the swarm "
                             "(the servers apply the weights)")  # fmt: skip
        init = fields.get("init_lora_weights", True)
        unsupported = {"use_dora": bool(fields.get("use_dora")),
                       "bias": fields.get("bias", "none") != "none",
                       "modules_to_save": bool(fields.get("modules_to_save")),
                       "layers_to_transform": fields.get("layers_to_transform") is not None,
                       "rank_pattern": bool(fields.get("rank_pattern")),
                       "alpha_pattern": bool(fields.get("alpha_pattern")),
                       # these initialisations change the base weights, which the servers hold
                       "init_lora_weights": init not in (True, False, "gaussian")}  # fmt: skip
        for key, bad in unsupported.items():
            if bad:
                raise ValueError(f"LoRA {key}={fields[key]!r} is not supported through the swarm")
        return settings

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def peft_config(self, base_model: str) -> dict[str, Any]:
        """adapter_config.json's content."""
        targets = self.target_modules
        return {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": self.r, "lora_alpha": self.lora_alpha, "lora_dropout": 0.0, "bias": "none",
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "use_rslora": self.use_rslora, "use_dora": False, "fan_in_fan_out": False,
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
            "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
            "layers_pattern": None,
        }  # fmt: skip


def _peft_fields(config: Any) -> dict[str, Any]:
    names = ("r", "lora_alpha", "target_modules", "lora_dropout", "use_rslora", "use_dora",
             "bias", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern",
             "init_lora_weights")  # fmt: skip
    return {n: getattr(config, n) for n in names if hasattr(config, n)}


def client_lora(config: Any, lora_config: Any, num_blocks: int) -> ClientLora:
    """The trainable LoRA weights `lora_config` asks for (None: peft's defaults); a saved
    adapter's directory gives its settings and weights, to go on training it."""
    settings = LoraSettings.parse({} if lora_config is None else lora_config)
    lora = ClientLora(settings, find_targets(config, settings, num_blocks))
    if isinstance(lora_config, str | Path):
        lora.load(lora_config, get_adapter(config).layer_prefix)
    return lora


def find_targets(config: Any, settings: LoraSettings, num_blocks: int
                 ) -> list[tuple[LoraTarget, str]]:  # fmt: skip
    """(target, full module name) of every block's linear module `settings` targets."""
    family = get_adapter(config)
    out = []
    for i in range(num_blocks):
        prefix = family.layer_prefix.format(i=i)
        for target in lora_targets(family.build_layer(i), i):
            if matches(settings.target_modules, prefix + target.module):
                out.append((target, prefix + target.module))
    if not out:
        raise ValueError(f"target_modules {settings.target_modules!r} match no linear module "
                         f"of the {config.model_type} blocks")  # fmt: skip
    return out


class ClientLora(nn.Module):
    """Trainable LoRA weights of the remote blocks, initialised as peft does (B = 0)."""

    def __init__(self, settings: LoraSettings, targets: Sequence[tuple[LoraTarget, str]]):
        super().__init__()
        self.settings = settings
        self.targets = [t for t, _ in targets]
        self.full_names = [name for _, name in targets]
        self.lora_A = nn.ParameterList(
            nn.Parameter(torch.empty(settings.r, t.in_features)) for t in self.targets
        )
        self.lora_B = nn.ParameterList(
            nn.Parameter(torch.zeros(t.out_features, settings.r)) for t in self.targets
        )
        for a in self.lora_A:
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def names(self, start: int, end: int) -> list[tuple[int, str, str]]:
        """(index, name of A, name of B) of the weights of blocks [start, end)."""
        return [(i, lora_name(t.block, t.module, "A"), lora_name(t.block, t.module, "B"))
                for i, t in enumerate(self.targets) if start <= t.block < end]  # fmt: skip

    def wire(self, start: int, end: int) -> dict[str, torch.Tensor]:
        """Blocks [start, end)'s weights as the servers take them: A, and B scaled (in the
        autograd graph: gradients reach the parameters)."""
        out = {}
        for i, name_a, name_b in self.names(start, end):
            out[name_a] = self.lora_A[i]
            out[name_b] = self.lora_B[i] * self.settings.scale
        return out

    def load(self, directory: str | Path, layer_prefix: str) -> None:
        """Set the weights to a saved adapter's (same targets and rank: go on training it)."""
        n = max(t.block for t in self.targets) + 1
        stored = read_adapter(Path(directory), layer_prefix, 0, n, scaled=False)
        wanted = {name for _, a, b in self.names(0, n) for name in (a, b)}
        if set(stored) != wanted:
            raise ValueError(f"{directory} adapts other modules than target_modules "
                             f"{self.settings.target_modules!r} select")  # fmt: skip
        with torch.no_grad():
            for i, name_a, name_b in self.names(0, n):
                self.lora_A[i].copy_(stored[name_a])
                self.lora_B[i].copy_(stored[name_b])

    def save(self, directory: str | Path, base_model: str) -> None:
        """A peft adapter directory (adapter_config.json + adapter_model.safetensors)."""
        weights = {name: (self.lora_A[i], self.lora_B[i])
                   for i, name in enumerate(self.full_names)}  # fmt: skip
        write_adapter(Path(directory), weights, self.settings.peft_config(base_model))
