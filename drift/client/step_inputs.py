"""What one step sends to one span, kept for replay, and a long step cut into chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from drift.client.extras import Tensors
from drift.wire.errors import BadRequest, DriftError


@dataclass(frozen=True)
class StepInputs:
    """What one step sent to one span: enough to replay it exactly."""

    hidden: torch.Tensor  # [B, T, H]
    position: int
    hypo_ids: torch.Tensor | None  # [B]
    attention_mask: torch.Tensor | None  # [B, T]
    prompts: torch.Tensor | None  # [n_blocks_of_session, B, P, H] (sliced per hop on send)
    per_layer: torch.Tensor | None = None  # [B, T, n_blocks_of_session, P] (sliced per hop)
    shared: Tensors = field(default_factory=dict)  # K/V of earlier donors this span read


@dataclass
class Chunk:
    """A step's chunk on its way along the spans: where it is and what it has so far."""

    step: StepInputs  # the chunk's inputs to the first span
    hidden: torch.Tensor  # its input to span `depth` ([B, t, H])
    depth: int = 0  # spans passed
    shared: Tensors = field(default_factory=dict)  # K/V of its positions donated so far
    outputs: list[torch.Tensor] = field(default_factory=list)  # blocks' outputs, when asked
    error: DriftError | None = None  # the pipeline's failure on span `depth`


def split_step(step: StepInputs, chunk_tokens: int) -> list[StepInputs]:
    """`step` as consecutive chunks of at most `chunk_tokens` tokens per row (0: one piece);
    the beam reorder goes with the first, deep prompts with all (they apply by position)."""
    tokens = step.hidden.shape[1]
    if chunk_tokens <= 0 or tokens <= chunk_tokens:
        return [step]
    out = []
    for a in range(0, tokens, chunk_tokens):
        b = min(tokens, a + chunk_tokens)
        out.append(StepInputs(
            step.hidden[:, a:b], step.position + a, step.hypo_ids if a == 0 else None,
            None if step.attention_mask is None else step.attention_mask[:, a:b], step.prompts,
            None if step.per_layer is None else step.per_layer[:, a:b], dict(step.shared),
        ))  # fmt: skip
    return out


def fork_history(history: list[StepInputs], tokens: int, rows: int) -> list[StepInputs]:
    """A one-row span's history as a fork's (InferenceSession.fork): what it was sent up to
    position `tokens`, each entry's row repeated `rows` times (views: nothing is copied);
    replayed in order it leaves a server with those tokens. BadRequest where an entry cannot
    be (a beam reorder, deep prompts, per-layer inputs, shared keys/values)."""
    out = []
    for past in history:
        if past.position >= tokens:
            continue
        if past.hypo_ids is not None or past.prompts is not None or past.per_layer is not None \
                or past.shared or past.hidden.shape[0] != 1:  # fmt: skip
            raise BadRequest("a session with beam reorders, deep prompts, per-layer inputs or "
                             "shared keys/values is not forked")  # fmt: skip
        keep = tokens - past.position
        mask = past.attention_mask
        out.append(StepInputs(
            past.hidden[:, :keep].expand(rows, -1, -1), past.position, None,
            None if mask is None else mask[:, :keep].expand(rows, -1), None,
        ))  # fmt: skip
    return out


def to_cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to("cpu")
