"""The bundled architecture families; importing this package registers each of them."""

from drift.models.adapters import alibi, gemma, llama

__all__ = ["alibi", "gemma", "llama"]
