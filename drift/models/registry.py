"""Adapters by `model_type`: each family registers itself with `@register(...)`.

The registry only maps names to adapter classes; it knows nothing about any family.
`get_adapter(config)` imports the bundled families on first use and builds the adapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from drift.wire.errors import BadRequest

if TYPE_CHECKING:
    from drift.models.adapters.base import Adapter

A = TypeVar("A", bound="type[Adapter]")

# Filled by the @register decorators when drift.models.adapters is imported (import-time,
# append-only: the registry pattern of petals' auto_config, not mutable runtime state).
_ADAPTERS: dict[str, type[Adapter]] = {}


def register(*model_types: str) -> Any:
    """Class decorator: serve `model_types` with the decorated adapter class."""

    def wrap(cls: A) -> A:
        for model_type in model_types:
            if model_type in _ADAPTERS and _ADAPTERS[model_type] is not cls:
                raise ValueError(f"model_type {model_type!r} is registered twice")
            _ADAPTERS[model_type] = cls
        return cls

    return wrap


def _load_families() -> None:
    import drift.models.adapters  # noqa: F401  (registers every bundled family)


def supported_model_types() -> list[str]:
    _load_families()
    return sorted(_ADAPTERS)


def get_adapter(config: Any) -> Adapter:
    """The adapter for `config.model_type`; BadRequest naming the supported types otherwise."""
    _load_families()
    model_type = getattr(config, "model_type", None)
    cls = _ADAPTERS.get(str(model_type))
    if cls is None:
        raise BadRequest(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(_ADAPTERS))}"
        )
    return cls(config)
