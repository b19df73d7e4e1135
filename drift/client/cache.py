"""RemoteCache: the transformers Cache that stands for a remote inference session.

It holds no tensors. GenerationMixin reads its length (tokens the servers have cached),
asks it to reorder rows for beam search (kept as `hypo_ids` for the next step) and to
crop for rollback; the model's forward sends steps through its session.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from drift.client.session import InferenceSession


class RemoteCache(Cache):
    def __init__(self, session: InferenceSession, *, owned: bool) -> None:
        super().__init__(layers=[])
        self.session = session
        self.owned = owned  # close the session when generate() returns
        self.prefix_length = 0  # prompt-tuning positions in the session ahead of the tokens
        self.pending_hypo_ids: torch.Tensor | None = None  # [B] for the next step
        self.token_ids: torch.Tensor | None = None  # [B, L] tokens the session has consumed
        self.attention_mask: torch.Tensor | None = None  # [B, L] their mask
        self.last_sequences: torch.Tensor | None = None  # generate()'s last output

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.session.position - self.prefix_length, 0)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.session.max_length - self.prefix_length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        idx = beam_idx.to("cpu", torch.int64)
        prev = self.pending_hypo_ids
        self.pending_hypo_ids = idx if prev is None else prev[idx]
        if self.token_ids is not None:
            self.token_ids = self.token_ids[idx]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[idx]

    def take_hypo_ids(self) -> torch.Tensor | None:
        hypo, self.pending_hypo_ids = self.pending_hypo_ids, None
        return hypo

    def crop(self, tokens_to_remove: int) -> None:
        """Roll back as transformers' Cache.crop does: `crop(-n)` drops the last n tokens (the
        next step starts n earlier); a positive n, the older convention, keeps n tokens."""
        seen = self.get_seq_length()
        keep = seen + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        keep = min(max(keep, 0), seen)
        self.session.rollback(self.prefix_length + keep)
        if self.token_ids is not None:
            self.token_ids = self.token_ids[:, :keep]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[:, :keep]

    def record(self, input_ids: torch.Tensor | None, mask: torch.Tensor) -> None:
        """Remember the tokens just sent (for resuming generate() inside a session)."""
        if input_ids is not None:
            ids = input_ids.detach().cpu()
            self.token_ids = ids if self.token_ids is None else torch.cat([self.token_ids, ids], 1)
        m = mask.detach().cpu()
        self.attention_mask = (
            m if self.attention_mask is None else torch.cat([self.attention_mask, m], 1)
        )

    def resume_inputs(self, inputs: torch.Tensor | None, kwargs: dict) -> tuple:
        """Full input ids (and kwargs, the mask completed) for a generate() call that
        continues this session: the tokens it consumed, then `inputs`' new ones."""
        history = self.last_sequences if self.last_sequences is not None else self.token_ids
        if inputs is None:
            if history is None:
                raise ValueError("this session began from inputs_embeds: give generate() input ids")
            inputs = history
        elif history is not None:
            history = history.to(inputs.device)
            if not (inputs.shape[1] >= history.shape[1]
                    and torch.equal(inputs[:, : history.shape[1]], history)):  # fmt: skip
                inputs = torch.cat([history, inputs], dim=1)  # new tokens appended
        if self.attention_mask is not None and kwargs.get("attention_mask") is None:
            seen = self.attention_mask.to(inputs.device)
            extra = inputs.shape[1] - seen.shape[1]
            kwargs["attention_mask"] = torch.cat([seen, seen.new_ones(seen.shape[0], extra)], dim=1)
        return inputs, kwargs

    def reset(self) -> None:
        self.crop(-self.get_seq_length())

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.session.position > 0

    @property
    def is_croppable(self) -> bool:
        return True

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_linear(self) -> list[bool]:
        return [False]

    @property
    def is_dummy(self) -> list[bool]:
        return [False]

    @property
    def batch_size(self) -> int:
        return self.session.batch_size

    def __len__(self) -> int:
        return self.session.end_block - self.session.start_block

    def __repr__(self) -> str:
        return f"RemoteCache(position={self.session.position}, blocks=[{self.session.start_block}, {self.session.end_block}))"
