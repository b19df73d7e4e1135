"""The KV-cache budget: block-tokens reserved by open sessions, never more than the total.

Only bookkeeping (no torch): `reserve` raises CacheFull instead of letting a session in
that would exhaust memory; `release` gives the room back; `check_share` refuses a client more than its fair share.
Not thread-safe by design: it is touched only from the event loop.
"""

from __future__ import annotations

from drift.wire.errors import CacheFull


class CacheBudget:
    def __init__(self, tokens_per_block: int, n_blocks: int) -> None:
        self.tokens_per_block = tokens_per_block  # tokens each served block can cache
        self.n_blocks = n_blocks  # blocks this server holds
        self.total = tokens_per_block * n_blocks  # block-tokens
        self.used = 0  # block-tokens reserved by open sessions

    @property
    def left(self) -> int:
        return self.total - self.used

    @property
    def tokens_left(self) -> int:
        """Tokens a session over the whole span could still reserve."""
        return self.left // self.n_blocks

    def reserve(self, block_tokens: int) -> int:
        if block_tokens > self.left:
            raise CacheFull(
                f"the session needs {block_tokens} block-tokens of KV cache but only "
                f"{self.left} of {self.total} are free; retry later or use a shorter max_length",
                needed=block_tokens,
                left=self.left,
            )
        self.used += block_tokens
        return block_tokens

    def check_share(self, client: str, held: int, more: int, *, share: float, others: int) -> None:
        """CacheFull (retryable, naming the limit) if `client`, holding `held` block-tokens in
        `others` other sessions, may not reserve `more`: beyond its first session a client
        holds at most `share` of the budget, so no one client can take all of it."""
        limit = int(share * self.total)
        if others and held + more > limit:
            raise CacheFull(
                f"client {client} holds {held} block-tokens of KV cache in {others} session(s); "
                f"{more} more would pass its share of {limit} of {self.total} "
                f"(client_cache_share={share:g}); close a session or retry later",
                needed=more,
                left=max(0, limit - held),
                limit="client_cache_share",
            )

    def release(self, block_tokens: int) -> None:
        assert 0 <= block_tokens <= self.used, "released more cache than was reserved"
        self.used -= block_tokens
