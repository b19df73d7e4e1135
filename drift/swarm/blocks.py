"""The `GET /blocks` document: what one block server holds and can take right now.

A block server builds it (drift.server), the dashboard and tools read it; the subset every
peer needs travels in the server's signed membership record (`record_fields`). Pure data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# The /blocks fields a server also announces in its membership record.
RECORD_FIELDS = ("model", "model_fingerprint", "num_blocks", "start_block", "end_block",
                 "dtype", "quant", "throughput", "cache_tokens_left", "cache_tokens_total",
                 "active_sessions", "state", "adapters")  # fmt: skip


@dataclass(frozen=True)
class BlocksInfo:
    model: str  # display name
    model_fingerprint: str
    num_blocks: int  # blocks of the whole model
    start_block: int  # the span served, half-open
    end_block: int
    hidden_size: int
    dtype: str  # compute dtype: float32 | float16 | bfloat16
    quant: str  # weight quantization: none | int8 | nf4
    throughput: float  # block-tokens per second of one block
    cache_tokens_total: int  # KV-cache tokens per served block
    cache_tokens_left: int  # tokens a session over the whole span could still reserve
    cache_block_tokens_total: int  # block-tokens in the budget
    cache_block_tokens_left: int
    active_sessions: int
    max_batch_size: int  # sequences per request or session
    inference_max_length: int  # largest max_length a session may open, tokens
    max_body_bytes: int  # largest request body or WebSocket message
    state: str  # joining | online | offline
    adapters: list[str] = field(default_factory=list)  # LoRA adapters served, by name
    # how decode steps run: mode (eager | lean | compiled), reason, compile_s (warm-up seconds)
    decode: dict[str, Any] = field(default_factory=dict)
    # the cores or GPU it computes on, by name (drift.server.compute_name); None: not said
    compute: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def record_fields(self) -> dict[str, Any]:
        """The membership-record fields of a server holding this span."""
        doc = self.to_wire()
        fields = {"role": "server", **{k: doc[k] for k in RECORD_FIELDS}}
        if self.compute is not None:  # a record without it stays as it was
            fields["compute"] = self.compute
        return fields
