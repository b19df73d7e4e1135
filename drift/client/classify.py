"""Sequence classification on the swarm: remote blocks, a client-side score head.

The pooled state is the last non-padding token after the final norm; `score` is read from
the checkpoint when it has one, else freshly initialised (and trainable, with prompts).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from drift.client.model import DistributedPreTrainedModel


class DistributedModelForSequenceClassification(DistributedPreTrainedModel):
    def _load_extra(self, ckpt: Any, dtype: torch.dtype) -> None:
        num_labels = int(getattr(self.config, "num_labels", 2) or 2)
        self.score = nn.Linear(self.config.hidden_size, num_labels, bias=False, dtype=dtype)
        found = ckpt.tensors("score.")
        if "weight" in found and found["weight"].shape == self.score.weight.shape:
            with torch.no_grad():
                self.score.weight.copy_(found["weight"])

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutputWithPast:  # fmt: skip
        hidden = self.model(
            input_ids, attention_mask, inputs_embeds=inputs_embeds, use_cache=False
        ).last_hidden_state  # [B, T, H] normed
        if attention_mask is None:
            last = torch.full((hidden.shape[0],), hidden.shape[1] - 1)
        else:
            last = torch.full((hidden.shape[0],), hidden.shape[1] - 1)  # left padding: last col
            if bool((attention_mask[:, -1] == 0).any()):  # right padding
                last = attention_mask.sum(dim=1) - 1
        pooled = hidden[torch.arange(hidden.shape[0]), last]  # [B, H]
        logits = self.score(pooled.to(self.score.weight.dtype))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits)
