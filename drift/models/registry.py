"""Adapters by `model_type`: the bundled families, looked up by name.

Importing this module imports every bundled family (drift.models.adapters), whose classes
register themselves with `@register(...)` (adapters/base.py). It knows nothing about any
family beyond its name, but which multimodal wrappers a text family serves as their text tower.
"""

from __future__ import annotations

from typing import Any

from drift.models.adapters import alibi, gemma, gemma4, llama  # noqa: F401  (registers the families)
from drift.models.adapters.base import ADAPTERS, Adapter
from drift.wire.errors import BadRequest

# Multimodal checkpoints served by their text tower's family (vision never read): the adapter
# of `config.get_text_config()`. (Gemma 4's own wrapper adapter also maps its placeholders.)
TEXT_TOWER_OF = frozenset({"gemma3", "mistral3"})


def supported_model_types() -> list[str]:
    return sorted({*ADAPTERS, *TEXT_TOWER_OF})


def get_adapter(config: Any) -> Adapter:
    """The adapter for `config.model_type`; BadRequest naming the supported types otherwise."""
    model_type = getattr(config, "model_type", None)
    if model_type in TEXT_TOWER_OF:
        config = config.get_text_config()
        model_type = config.model_type
    cls = ADAPTERS.get(str(model_type))
    if cls is None:
        raise BadRequest(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(ADAPTERS))}"
        )
    return cls(config)
