"""Auto classes and per-family names for the distributed models.

AutoDistributedModelForCausalLM.from_pretrained(name, initial_peers=...) returns the
family's class (e.g. DistributedLlamaForCausalLM); every family shares one implementation
because the servers run the family-specific blocks.
"""

from __future__ import annotations

from typing import Any

from drift.client.classify import DistributedModelForSequenceClassification
from drift.client.loading import open_client_model, resolve_dtype
from drift.client.model import DistributedModelForCausalLM
from drift.client.speculative import DistributedModelForSpeculativeGeneration


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


class DistributedLlamaForSpeculativeGeneration(DistributedModelForSpeculativeGeneration):
    pass


def _open(name_or_path: Any, kwargs: dict[str, Any]) -> Any:
    """The model, opened once (drift.client.resolve; its Hub arguments taken out of kwargs;
    a GGUF converts to the client's dtype)."""
    dtype = resolve_dtype(kwargs.get("dtype"), kwargs.get("torch_dtype"))
    return open_client_model(name_or_path, cache_dir=kwargs.pop("cache_dir", None),
                             revision=kwargs.pop("revision", None), dtype=dtype,
                             token=kwargs.pop("token", None),
                             initial_peers=kwargs.get("initial_peers"),
                             swarm_key=kwargs.get("swarm_key"))  # fmt: skip


class AutoDistributedModelForCausalLM:
    @classmethod
    def from_pretrained(
        cls, name_or_path: Any = None, **kwargs: Any
    ) -> DistributedModelForCausalLM:
        resolved = _open(name_or_path, kwargs)
        family = FAMILY_CLASSES.get(str(resolved.ckpt.config.model_type),
                                    DistributedModelForCausalLM)  # fmt: skip
        return family.from_pretrained(resolved, **kwargs)


class AutoDistributedSpeculativeModel:
    """Petals' speculative model: `from_pretrained(name, small_model=local_model, ...)`."""

    @classmethod
    def from_pretrained(
        cls, name_or_path: Any = None, **kwargs: Any
    ) -> DistributedModelForSpeculativeGeneration:
        resolved = _open(name_or_path, kwargs)
        family: type[DistributedModelForSpeculativeGeneration] = (
            DistributedLlamaForSpeculativeGeneration
            if resolved.ckpt.config.model_type == "llama"
            else DistributedModelForSpeculativeGeneration
        )
        return family.from_pretrained(resolved, **kwargs)


class AutoDistributedModelForSequenceClassification:
    @classmethod
    def from_pretrained(
        cls, name_or_path: Any = None, **kwargs: Any
    ) -> DistributedModelForSequenceClassification:
        return DistributedModelForSequenceClassification.from_pretrained(name_or_path, **kwargs)
