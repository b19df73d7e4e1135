"""Adapters by `model_type`: the bundled families, looked up by name.

Importing this module imports every bundled family (drift.models.adapters), whose classes
register themselves with `@register(...)` (adapters/base.py). It knows nothing about any
family beyond its name.
"""

from __future__ import annotations

from typing import Any

from drift.models.adapters import alibi, gemma, gemma4, llama  # noqa: F401  (registers the families)
from drift.models.adapters.base import ADAPTERS, Adapter
from drift.wire.errors import BadRequest


def supported_model_types() -> list[str]:
    return sorted(ADAPTERS)


def get_adapter(config: Any) -> Adapter:
    """The adapter for `config.model_type`; BadRequest naming the supported types otherwise."""
    model_type = getattr(config, "model_type", None)
    cls = ADAPTERS.get(str(model_type))
    if cls is None:
        raise BadRequest(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(ADAPTERS))}"
        )
    return cls(config)
