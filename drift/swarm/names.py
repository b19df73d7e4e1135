"""What a user may type for a served model, as the records name it.

A server's record carries its checkpoint's name: an alias's display name ("smollm2" ->
"SmolLM2-135M-Instruct"), a directory's base name, a GGUF file's stem, a Hub id as typed.
`model_names(text)` gives every name `text` may stand for, so `?model=`, the API's `model`
and whatever else matches by name accept what started the server; `join_name` is the name
another machine types. Pure strings; no file is read.
"""

from __future__ import annotations

import re

# drift.models.sources.aliases.ALIASES, short name -> display name (a test keeps them equal;
# the swarm package does not import the model code)
ALIAS_NAMES: dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct",
    "gemma3-270m": "gemma-3-270m",
}


def model_names(text: str) -> tuple[str, ...]:
    """`text` and the record names it may stand for (first: `text` itself)."""
    out = [text]
    base = re.split(r"[\\/]", text.rstrip("/\\"))[-1]
    if base.lower().endswith(".gguf"):
        out.append(base[: -len(".gguf")])
    elif base:
        out.append(base)
    folded = text.casefold()
    out += [name for key, name in ALIAS_NAMES.items() if folded == key]
    return tuple(dict.fromkeys(out))


def names_match(text: str, record_name: str | None) -> bool:
    """Whether `text` (as a user typed it) names a record's model (names compare in any case)."""
    if record_name is None:
        return False
    folded = record_name.casefold()
    return any(name.casefold() == folded for name in model_names(text))


def same_model(a: str, b: str) -> bool:
    """Whether two names as users typed them (alias, directory, GGUF file, Hub id, record
    name) may stand for one model: some name of each is a name of the other."""
    names_a = {name.casefold() for name in model_names(a)}
    return any(name.casefold() in names_a for name in model_names(b))


def join_name(record_name: str | None) -> str | None:
    """What another machine types to serve the model a record names: an alias's short name
    for its display name ("SmolLM2-135M-Instruct" -> "smollm2"), else the name as recorded
    (a Hub id; a directory's or GGUF file's name, relative to where the command runs)."""
    if record_name is None:
        return None
    folded = record_name.casefold()
    return next((key for key, name in ALIAS_NAMES.items() if name.casefold() == folded),
                record_name)  # fmt: skip
