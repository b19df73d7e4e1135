"""Where a checkpoint keeps its text model's tensors: found from the tensor names themselves.

Adapters name tensors as a text-only checkpoint does (`model.layers.{i}.`, `model.norm.`,
`model.embed_tokens.weight`, `lm_head.weight`: the canonical names). A multimodal checkpoint
keeps the same tensors under its text tower: `model.language_model.` (transformers 5 saves of
Gemma 3, Gemma 4, Mistral 3 style models) or `language_model.model.` (older saves, whose head
is `language_model.lm_head.`). `TextLayout.find(names)` tries each known tower prefix and picks
the one holding a first layer (or, in a checkpoint of client parts only, the embeddings);
`stored(canonical)` maps a canonical name or prefix to the checkpoint's. Pure: names only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

CANONICAL_TOWER = "model."
CANONICAL_HEAD = "lm_head."
# Text tower prefixes, in the order tried: a text-only checkpoint, then multimodal wrappers.
TOWERS = ("model.", "model.language_model.", "language_model.model.")
# Where each tower keeps its LM head: the names tried, in order.
HEADS = {
    "model.": ("lm_head.",),
    "model.language_model.": ("lm_head.", "model.lm_head."),
    "language_model.model.": ("language_model.lm_head.", "lm_head."),
}
# What marks a tower: its first layer (a server's checkpoint), else its embeddings (a client's).
_MARKS = ("layers.0.", "embed_tokens.weight")


@dataclass(frozen=True)
class TextLayout:
    tower: str = CANONICAL_TOWER  # where the canonical `model.` tensors are stored
    head: str = CANONICAL_HEAD  # where the canonical `lm_head.` tensors are stored

    @classmethod
    def find(cls, names: Iterable[str]) -> TextLayout:
        """The layout of a checkpoint with these tensor names (the identity when no known
        tower holds a first layer or embeddings: bloom/falcon's `transformer.`, for one)."""
        names = sorted(set(names))
        for mark in _MARKS:
            for tower in TOWERS:
                if _any_under(names, tower + mark):
                    heads = HEADS[tower]
                    head = next((h for h in heads if _any_under(names, h)), heads[0])
                    return cls(tower, head)
        return cls()

    @property
    def is_identity(self) -> bool:
        return self.tower == CANONICAL_TOWER and self.head == CANONICAL_HEAD

    def stored(self, canonical: str) -> str:
        """The checkpoint's name (or prefix) for a canonical one."""
        if canonical.startswith(CANONICAL_TOWER):
            return self.tower + canonical[len(CANONICAL_TOWER) :]
        if canonical.startswith(CANONICAL_HEAD):
            return self.head + canonical[len(CANONICAL_HEAD) :]
        return canonical

    def is_text(self, name: str) -> bool:
        """False for what a multimodal checkpoint holds beside its text tower and head (vision,
        audio, projectors); every name of a text-only checkpoint is text."""
        if self.tower == CANONICAL_TOWER:
            return True
        return name.startswith((self.tower, self.head))

    def missing(self, canonical: str) -> str:
        """The message for a tensor (or block prefix) the checkpoint truly lacks, naming the
        text tower prefixes tried."""
        return (
            f"the checkpoint has no tensor {self.stored(canonical)!r} (canonical name "
            f"{canonical!r}; text tower prefixes tried: {', '.join(TOWERS)}; found: "
            f"{self.tower!r}, head {self.head!r})"
        )


def _any_under(sorted_names: list[str], prefix: str) -> bool:
    """True when a name in `sorted_names` starts with `prefix` (binary search)."""
    i = bisect.bisect_left(sorted_names, prefix)
    return i < len(sorted_names) and sorted_names[i].startswith(prefix)
