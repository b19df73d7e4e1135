"""Auto classes and per-family names for the distributed models.

AutoDistributedModelForCausalLM.from_pretrained(name, initial_peers=...) returns the
family's class (e.g. DistributedLlamaForCausalLM); every family shares one implementation
because the servers run the family-specific blocks.
"""

from __future__ import annotations

from typing import Any

from drift.client.classify import DistributedModelForSequenceClassification
from drift.client.model import DistributedModelForCausalLM


class DistributedLlamaForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedMistralForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedQwen2ForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedQwen3ForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedGemma2ForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedFalconForCausalLM(DistributedModelForCausalLM):
    pass


class DistributedBloomForCausalLM(DistributedModelForCausalLM):
    pass


FAMILY_CLASSES: dict[str, type[DistributedModelForCausalLM]] = {
    "llama": DistributedLlamaForCausalLM,
    "mistral": DistributedMistralForCausalLM,
    "qwen2": DistributedQwen2ForCausalLM,
    "qwen3": DistributedQwen3ForCausalLM,
    "gemma2": DistributedGemma2ForCausalLM,
    "falcon": DistributedFalconForCausalLM,
    "bloom": DistributedBloomForCausalLM,
}


def _model_type(name_or_path: Any, kwargs: dict[str, Any]) -> str:
    from drift.client.loading import resolve_dtype
    from drift.models.checkpoint import open_checkpoint

    dtype = resolve_dtype(kwargs.get("dtype"), kwargs.get("torch_dtype"))  # a GGUF converts to it
    ckpt = open_checkpoint(str(name_or_path), cache_dir=kwargs.get("cache_dir"),
                           revision=kwargs.get("revision"), blocks=range(0), dtype=dtype)  # fmt: skip
    return str(ckpt.config.model_type)


class AutoDistributedModelForCausalLM:
    @classmethod
    def from_pretrained(cls, name_or_path: Any, **kwargs: Any) -> DistributedModelForCausalLM:
        family = FAMILY_CLASSES.get(_model_type(name_or_path, kwargs), DistributedModelForCausalLM)
        return family.from_pretrained(name_or_path, **kwargs)


class AutoDistributedModelForSequenceClassification:
    @classmethod
    def from_pretrained(
        cls, name_or_path: Any, **kwargs: Any
    ) -> DistributedModelForSequenceClassification:
        return DistributedModelForSequenceClassification.from_pretrained(name_or_path, **kwargs)
