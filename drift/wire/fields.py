"""Helpers the typed messages share (messages.py, step.py): a frame's head, its tensors
split into the message's own and the named extras beside them, a reply's checked extras.

Knows nothing about sockets, frames' bytes or models.
"""

from __future__ import annotations

from typing import Any

import torch

from drift.wire import checks as c
from drift.wire.extras import BLOCK_STATES, GRAD_PREFIX, kv_names, reply_shape, states_shape
from drift.wire.version import PROTOCOL_VERSION

Tensors = dict[str, torch.Tensor]


def head(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "version": PROTOCOL_VERSION, **fields}


def present(**named: torch.Tensor | None) -> Tensors:
    return {name: t for name, t in named.items() if t is not None}


def nested(t: torch.Tensor | None) -> Any:
    return None if t is None else t.detach().float().cpu().tolist()


def with_donate(
    params: dict[str, Any], donate: tuple[int, ...], states: bool = False
) -> dict[str, Any]:
    """`donate` and `block_states` only when asked: other frames stay byte-identical."""
    if donate:
        params["donate"] = list(donate)
    if states:
        params[BLOCK_STATES] = True
    return params


def split(tensors: Tensors, base: tuple[str, ...]) -> tuple[Tensors, Tensors]:
    """(the message's own tensors, the named extras beside them)."""
    own = {k: v for k, v in tensors.items() if k in base}
    return own, {k: v for k, v in tensors.items() if k not in base}


def reply_extras(
    tensors: Tensors, names: tuple[str, ...], hidden: torch.Tensor, states: int = 0
) -> Tensors:
    """A reply's named extras: exactly `names` (+ the `states` blocks' outputs when > 0),
    batch and tokens those of `hidden`."""
    specs = tuple((name, reply_shape(name.removeprefix(GRAD_PREFIX))) for name in names)
    if states:
        specs += ((BLOCK_STATES, states_shape(states, hidden.shape[-1])),)
    return c.check_named(tensors, specs, batch=hidden.shape[0], tokens=hidden.shape[1])


def donated_names(donate: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(name for block in donate for name in kv_names(block))
