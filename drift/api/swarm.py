"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation opens its own remote session through the client's public API
(`model.open_session`, then `generate(..., session=s)`), so concurrent requests never share
server-side caches, a cancelled request frees its caches at once, and the session's spans
tell which servers ran the blocks. A request may name a LoRA adapter the swarm serves
("model:adapter"): its sessions ask for it, and routing uses only servers holding it.
With a `SessionPool` (drift.api.prefix), a one-row generation of the base model keeps its
session when it ends cleanly and a later prompt starting with its tokens (the next chat
turn) continues it: only the new tokens are sent. Such sessions are opened
`headroom_tokens` longer than asked, so the next turn fits without reopening. A request (or
a group of rows) whose prompt shares only a part of a held session (a system prompt) is
forked from it: its servers copy those tokens' caches (into every row), only the rest of
each prompt is sent, and the held session stays for its own conversation. A group whose
prompts share a long prefix that no session holds yet has it computed once, in a one-row
session then held, and is forked from that. (Sessions of an adapter are not pooled.) To the
servers the API is one client: when no server has room for a new session, the pool's idle
sessions are closed, oldest first, until one has (SessionPool.make_room), and where the
headroom does not fit (a server's length limit, or still no room) the session opens
without it. New sessions open with their first step (drift.client's InferenceSession:
its opens are not waited for, one round trip less before the first token).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from drift.api.engine import CausalLMEngine, OpenedSessions, ServedSpan
from drift.api.prefix import SessionPool, common_prefix
from drift.client.routing import missing_blocks
from drift.models.registry import get_adapter
from drift.wire.errors import CacheFull, DriftError

FORK_MIN_SAVED = 64  # prompt tokens a group's shared prefix must save to be computed apart


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, pool: SessionPool | None = None,
                 headroom_tokens: int = 512, **kwargs: Any) -> CausalLMEngine:  # fmt: skip
    """An engine over a `DistributedModelForCausalLM` (from drift.client); with `pool`,
    one-row generations continue held sessions sharing their prompt's prefix."""

    def open_new(max_length: int, batch_size: int, *, headroom: int = 0,
                 adapter: str | None = None) -> Any:  # fmt: skip
        """model.open_session, `headroom` tokens longer where the servers take them; it
        opens with its first step. Where no server has room for it (its KV budget, or this
        API's share of it as one client), the API's own idle held sessions give theirs back
        first, least recently used first, before the refusal reaches the request."""
        return model.open_session(
            max_length=max_length + headroom, batch_size=batch_size, active_adapter=adapter,
            headroom=headroom, make_room=None if pool is None else pool.make_room,
        )  # fmt: skip

    def forked(max_length: int, prompts: Sequence[Sequence[int]]) -> Any | None:
        """A session for the rows forked from a held one sharing their prompts' prefix
        (its cache then holds those tokens), or None. With sliding-window layers, only
        prompts of one length are forked: padding after the prefix would shift a window."""
        assert pool is not None
        if model.client.sharing.consumers:  # Gemma 4: servers do not fork shared K/V
            return None
        if len({len(p) for p in prompts}) > 1 and sliding(model.config):
            return None
        lent = pool.lend(prompts)
        if lent is None and hold_prefix(prompts):
            lent = pool.lend(prompts)
        if lent is None:
            return None
        held, tokens = lent
        try:
            while True:
                try:
                    return model.fork_session(held, len(prompts), max_length=max_length,
                                              tokens=tokens)  # fmt: skip
                except CacheFull:  # the API's other held sessions give their room first
                    if not pool.release_oldest():
                        return None
                except DriftError:
                    return None  # a server refused (an older one): computed in full
        finally:
            pool.put(held)  # unchanged: the next turn of its own conversation still finds it

    def hold_prefix(prompts: Sequence[Sequence[int]]) -> bool:
        """For a group whose prompts share a prefix worth computing once (FORK_MIN_SAVED
        tokens of compute saved, at least the pool's min_tokens): a one-row session that
        computed it, held in the pool; whether one is."""
        assert pool is not None
        if len(prompts) < 2:
            return False
        shared = min(min(common_prefix(prompts[0], p) for p in prompts[1:]),
                     min(len(p) for p in prompts) - 1)  # fmt: skip
        if shared < pool.min_tokens or (len(prompts) - 1) * shared < FORK_MIN_SAVED:
            return False
        session = open_new(shared, 1, headroom=headroom_tokens)
        try:
            ids = torch.tensor([list(prompts[0][:shared])], dtype=torch.long)
            model.model(ids, cache=model.cache_for(session), use_cache=True)
        except DriftError:
            session.close()
            return False
        pool.put(session)
        return True

    def open_session(max_length: int, batch_size: int, adapter: str | None,
                     prompts: Sequence[Sequence[int]] | None) -> Any:  # fmt: skip
        if pool is None or prompts is None or adapter is not None:
            return open_new(max_length, batch_size, adapter=adapter)
        if len(prompts) > 1:
            session = forked(max_length, prompts)
            return session or open_new(max_length, batch_size)
        held = pool.take(prompts[0], max_length)  # the next turn of its conversation
        if held is not None:
            return held
        # room for the next turn, where the servers allow it
        session = forked(max_length + headroom_tokens, prompts)  # a system prompt, say
        if session is not None:
            return session
        return open_new(max_length, 1, headroom=headroom_tokens)

    @contextlib.contextmanager
    def sessions(max_length: int, batch_size: int, adapter: str | None = None,
                 prompts: Sequence[Sequence[int]] | None = None,
                 ) -> Iterator[OpenedSessions]:  # fmt: skip
        session = open_session(max_length, batch_size, adapter, prompts)

        def route() -> tuple[ServedSpan, ...]:
            return tuple(
                ServedSpan(s.hop.peer_id, s.hop.addr, s.hop.start_block, s.hop.end_block)
                for s in session.spans
            )

        try:
            yield OpenedSessions({"session": session}, route)
        except BaseException:
            session.close()
            raise
        if pool is not None and prompts is not None and len(prompts) == 1 and adapter is None:
            pool.put(session)  # closed there unless it can be matched later
        else:
            session.close()

    def adapters() -> tuple[str, ...]:  # blocking: refreshes the client's table when stale
        client = model.client
        client.run(client.swarm.refresh())
        return served_adapters(client.swarm.servers(client.model_fingerprint), model.num_blocks)

    return CausalLMEngine(model, tokenizer, model_id=model_id, sessions=sessions,
                          adapters=adapters, **kwargs)  # fmt: skip


def sliding(config: Any) -> bool:
    """Whether any layer of the model attends through a sliding window."""
    adapter = get_adapter(config)
    text = config.get_text_config()
    return any(adapter.layer_type(i) != "full_attention"
               for i in range(int(text.num_hidden_layers)))  # fmt: skip


def served_adapters(servers: Any, num_blocks: int) -> tuple[str, ...]:
    """The LoRA adapters whose servers (drift.client.routing.ServerInfo) cover every block."""
    names = sorted({name for s in servers for name in s.adapters})
    return tuple(name for name in names
                 if not missing_blocks([s for s in servers if name in s.adapters], 0, num_blocks))  # fmt: skip
