"""Speculative generation as Petals names it, built on transformers' assisted generation.

A small local model (`small_model=`) drafts tokens; the swarm checks several of them in one
step and the remote cache rolls back what it rejects (RemoteCache.crop). Results equal
plain generate()'s, as transformers promises for assisted generation (greedy: the same
tokens). Nothing here knows the wire: generate() only adds `assistant_model`.
"""

from __future__ import annotations

from typing import Any

import torch

from drift.client.model import DistributedModelForCausalLM


class DistributedModelForSpeculativeGeneration(DistributedModelForCausalLM):
    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, name_or_path: Any, *, small_model: Any, **kwargs: Any
    ) -> DistributedModelForSpeculativeGeneration:
        """`small_model`: a local transformers causal LM with the same tokenizer."""
        model = super().from_pretrained(name_or_path, **kwargs)
        model.set_small_model(small_model)
        return model

    def set_small_model(self, small_model: Any) -> None:
        # kept out of the module tree: it is the caller's model (its own device and dtype)
        object.__setattr__(self, "small_model", small_model)

    def generate(self, inputs: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        """generate() drafting with `small_model` (unless another assistant or prompt lookup
        is given)."""
        if kwargs.get("assistant_model") is None and not kwargs.get("prompt_lookup_num_tokens"):
            kwargs["assistant_model"] = self.small_model
        return super().generate(inputs, *args, **kwargs)
