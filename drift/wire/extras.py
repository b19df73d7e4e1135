"""Named tensors beside hidden_states in a frame (Gemma 4): per-layer inputs, shared K/V.

A span whose blocks take per-layer inputs receives `per_layer_inputs`; a span whose blocks
reuse the keys/values of an earlier block (a donor) receives them as `kv.<donor>.k/v`, and a
span holding a donor gives them back when a request lists the donor in `donate`. Gradients
of these travel as `grad.<name>`. `ExtraSpec` says which a (sub-)span takes and can give,
with shapes as templates over the hidden states' batch "B" and tokens "T" ("*": any size).
Any family's reply also carries `block_states` (each block's output) when a request asks,
and any request may carry LoRA weights (drift.wire.lora), whose gradients come back too.
Knows nothing about models: drift.models builds the spec of a span; checks.py enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from drift.wire.lora import LoraTarget, is_lora

PER_LAYER_INPUTS = "per_layer_inputs"  # [B, T, n_blocks, P]
BLOCK_STATES = "block_states"  # [B, T, n_blocks, H] each block's output, in a reply that asked
GRAD_PREFIX = "grad."

Shape = tuple[int | str, ...]  # ints are exact sizes; "B", "T" and "*" as said above


def kv_names(block: int) -> tuple[str, str]:
    """The frame names of the keys and values that block `block` shares with later blocks."""
    return f"kv.{block}.k", f"kv.{block}.v"


def kv_block(name: str) -> int:
    """The donor block a K/V name belongs to ("kv.3.k" -> 3)."""
    return int(name.split(".")[1])


def grad_name(name: str) -> str:
    return GRAD_PREFIX + name


@dataclass(frozen=True)
class ExtraSpec:
    """What a (sub-)span takes and can give beside hidden_states."""

    inputs: tuple[tuple[str, Shape], ...] = ()  # required in every request, with their shapes
    donors: tuple[tuple[int, Shape], ...] = ()  # blocks whose K/V a request may ask back
    lora: tuple[LoraTarget, ...] = ()  # modules optional LoRA weights may adapt (wire.lora)

    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.inputs)

    def outputs(self, donate: tuple[int, ...]) -> tuple[tuple[str, Shape], ...]:
        """The named K/V tensors a reply carries for `donate` (each donor's k then v)."""
        shapes = dict(self.donors)
        return tuple((name, shapes[block]) for block in donate for name in kv_names(block))


NO_EXTRAS = ExtraSpec()


def concrete(shape: Shape, batch: int, tokens: int) -> tuple[int, ...]:
    """A template's sizes for `batch` sequences of `tokens` tokens (no "*" allowed)."""
    sizes = {"B": batch, "T": tokens}
    return tuple(sizes[d] if isinstance(d, str) else d for d in shape)


def reply_shape(name: str) -> Shape:
    """The shape template of a named tensor in a reply, whose other sizes the asker checks
    no further: per-layer inputs are [B, T, n, P], keys/values [B, heads, T, head_dim],
    LoRA weights [r, in] or [out, r]."""
    if is_lora(name):
        return ("*", "*")
    return ("B", "T", "*", "*") if name == PER_LAYER_INPUTS else ("B", "*", "T", "*")


def token_axis(name: str) -> int:
    """Where a named tensor's tokens lie: per-layer inputs and block states [B, T, ...]: 1;
    keys/values [B, heads, T, D]: 2 (LoRA weights have none: ValueError)."""
    return reply_shape(name).index("T")


def states_shape(n_blocks: int, hidden_size: int) -> Shape:
    """The shape of `block_states` in a reply for `n_blocks` blocks."""
    return ("B", "T", n_blocks, hidden_size)
