"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation gets its own remote sessions through the client's public API: a plain
`generate()` opens and closes its own, safely from several threads at once, so concurrent
requests never share server-side caches and a cancelled request frees its caches at once.
"""

from __future__ import annotations

from typing import Any

from drift.api.engine import CausalLMEngine


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, **kwargs: Any) -> CausalLMEngine:
    """An engine over a `DistributedModelForCausalLM` (from drift.client)."""
    return CausalLMEngine(model, tokenizer, model_id=model_id, **kwargs)
