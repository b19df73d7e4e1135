"""ForwardCache: the remote cache a forward call returns, for a later call to continue from.

`model(ids)` keeps the call's inputs (`pending`) and costs nothing more until a later call
continues from it: that call's session takes them first. `model(ids, use_cache=True)` steps
the session at once. The session grows (each server's session extended in place) when a
step needs more room, and closes when the cache is collected or the model closed.
Knows nothing of the model: drift.client.backbone drives it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from drift.client.cache import RemoteCache
from drift.client.session import InferenceSession
from drift.wire.errors import CacheFull, LengthExceeded


@dataclass(frozen=True)
class Pending:
    """A stateless call's inputs, not yet in the session."""

    input_ids: torch.Tensor | None  # [B, P], None when the call gave inputs_embeds
    hidden: torch.Tensor  # [B, P, H] block 0's input
    mask: torch.Tensor  # [B, P] 1 = token, 0 = left padding

    def rows(self, idx: torch.Tensor) -> Pending:
        ids = None if self.input_ids is None else self.input_ids[idx.to(self.input_ids.device)]
        return Pending(
            ids, self.hidden[idx.to(self.hidden.device)], self.mask[idx.to(self.mask.device)]
        )

    def first(self, keep: int) -> Pending:
        ids = None if self.input_ids is None else self.input_ids[:, :keep]
        return Pending(ids, self.hidden[:, :keep], self.mask[:, :keep])


class ForwardCache(RemoteCache):
    def __init__(
        self, session: InferenceSession, *, headroom: int, pending: Pending | None = None
    ) -> None:
        super().__init__(session, owned=False)
        self.pending = pending
        self.headroom = headroom  # tokens reserved past what a step needs when (re)opening
        # close the session's sockets (without waiting) when this cache is collected
        weakref.finalize(self, session.close, wait=False)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        waiting = 0 if self.pending is None else self.pending.hidden.shape[1]
        return super().get_seq_length(layer_idx) + waiting

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # grows on demand

    def take_pending(self) -> Pending | None:
        pending, self.pending = self.pending, None
        return pending

    def make_room(self, tokens: int) -> None:
        """Before stepping `tokens` session positions: grow the session if they do not fit,
        doubling (few round trips), else to what is needed (a server's largest max_length)."""
        needed = self.session.position + tokens
        if needed <= self.session.max_length:
            return
        wanted = max(2 * self.session.max_length, needed + self.headroom)
        if self.session.position == 0:
            wanted = needed + self.headroom
        for target in sorted({wanted, needed + self.headroom, needed}, reverse=True):
            try:
                self.session.extend(target)
                return
            except (LengthExceeded, CacheFull):
                if target == needed:
                    raise

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.pending is not None:
            self.pending = self.pending.rows(beam_idx)
        super().reorder_cache(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        if self.pending is None:
            super().crop(tokens_to_remove)
            return
        seen = self.get_seq_length()  # all pending: the session has not stepped yet
        keep = seen + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        self.pending = self.pending.first(min(max(keep, 0), seen))

    def __repr__(self) -> str:
        waiting = 0 if self.pending is None else self.pending.hidden.shape[1]
        return f"ForwardCache(position={self.session.position}, pending={waiting})"
