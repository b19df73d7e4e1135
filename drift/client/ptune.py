"""Prompt tuning held by the client: trainable prefix embeddings and deep prompts.

"ptune" prepends `pre_seq_len` trainable embeddings to the input; "deep_ptune" also adds
trainable prompts to the first `pre_seq_len` positions before every block (sent to the
servers as `prompts`). Only these parameters train; the servers' blocks stay frozen.
"""

from __future__ import annotations

import torch
from torch import nn

TUNING_MODES = (None, "ptune", "deep_ptune", "lora")  # "lora": drift.client.lora


class PromptTuning(nn.Module):
    def __init__(self, mode: str, pre_seq_len: int, hidden_size: int, num_blocks: int) -> None:
        super().__init__()
        if mode not in ("ptune", "deep_ptune"):
            raise ValueError(f"tuning_mode must be one of {TUNING_MODES}, got {mode!r}")
        if pre_seq_len < 1:
            raise ValueError(f"tuning_mode={mode!r} needs pre_seq_len >= 1, got {pre_seq_len}")
        self.mode, self.pre_seq_len, self.num_blocks = mode, pre_seq_len, num_blocks
        self.prompt_embeddings = nn.Parameter(torch.randn(pre_seq_len, hidden_size) * 0.02)
        self.deep_prompts = (
            nn.Parameter(torch.zeros(num_blocks, pre_seq_len, hidden_size))
            if mode == "deep_ptune"
            else None
        )

    def prefix(self, batch_size: int, dtype: torch.dtype) -> torch.Tensor:
        """[B, P, H] embeddings to prepend to the tokens' embeddings."""
        return self.prompt_embeddings.to(dtype).unsqueeze(0).expand(batch_size, -1, -1)

    def prompts(self, batch_size: int, dtype: torch.dtype) -> torch.Tensor | None:
        """[n_blocks, B, P, H] deep prompts, or None for plain ptune."""
        if self.deep_prompts is None:
            return None
        return self.deep_prompts.to(dtype).unsqueeze(1).expand(-1, batch_size, -1, -1)
