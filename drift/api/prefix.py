"""Prefix reuse: remote sessions kept after a generation, continued by the next request
that starts with their tokens (the next turn of a conversation), and copied by requests
that share only a part of them (a system prompt).

`SessionPool` holds at most `max_sessions` idle sessions (least recently used dropped and
closed first, and any idle longer than `ttl_s`), each with the token ids its servers'
caches hold. `take(prompt, max_length)` gives the held session that `prompt` continues
(it starts with all its tokens, or all but the last), rolled back to the shared prefix so
the rest of the prompt is its next step, or None. `lend(prompts)` hands out, for a moment,
the held session sharing the longest prefix with every one of `prompts` (at least
`min_tokens`), to be `put` back unchanged: the requests' sessions are forked from it
(drift.client's InferenceSession.fork), and it stays for its own conversation's next
turn. `put` keeps a session whose generation ended cleanly; `release_oldest` (or, awaited
on the client's loop by a session that opens with its first step, `make_room`) gives a held
session's room back when a server has none for a new one.
Thread-safe (generations run on executor threads). Knows nothing of HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class _Held:
    session: Any  # drift.client.session.InferenceSession
    ids: tuple[int, ...]  # tokens its caches hold, in order
    since: float  # when it was put back (time.monotonic())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SessionPool:
    def __init__(self, model: Any, *, max_sessions: int = 8, ttl_s: float = 120.0,
                 min_tokens: int = 16) -> None:  # fmt: skip
        self.model = model  # drift.client's causal LM (cache_for: the session's RemoteCache)
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s  # below the servers' session timeout: a held cache is still there
        self.min_tokens = min_tokens  # a shorter shared prefix is not worth a held session
        self.hits = 0  # requests that continued a held session
        self.reused_tokens = 0  # prompt tokens they did not send again
        self.released = 0  # held sessions closed early to make room for a new one
        self._lock = threading.Lock()
        self._held: OrderedDict[int, _Held] = OrderedDict()  # id(session) -> held, LRU first

    def take(self, prompt: Sequence[int], max_length: int) -> Any | None:
        """The held session `prompt` continues, sharing the longest prefix with it (at least
        `min_tokens`; rolled back to it, room for `max_length` tokens made), removed from the
        pool; None if it continues none."""
        with self._lock:
            stale = self._expire()
            best, best_n = None, 0
            for key, held in self._held.items():
                n = min(common_prefix(held.ids, prompt), len(prompt) - 1)
                if n >= max(best_n, self.min_tokens, len(held.ids) - 1):
                    best, best_n = key, n
            taken = None if best is None else self._held.pop(best)
        for held in stale:
            held.session.close(wait=False)
        if taken is None:
            return None
        session = taken.session
        cache = self.model.cache_for(session)
        cache.crop(best_n)  # the next step starts at the first token not shared
        cache.last_sequences = None
        if session.max_length < max_length:
            session.extend(max_length)  # grown in place: the servers keep its caches
        with self._lock:
            self.hits += 1
            self.reused_tokens += best_n
        return session

    def lend(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, int] | None:
        """The held session sharing the longest prefix with every one of `prompts` (at least
        `min_tokens`, leaving each prompt a token) and that prefix's length, out of the pool
        until `put` back (nobody steps it meanwhile); None if none shares enough."""
        limit = min(len(p) for p in prompts) - 1
        with self._lock:
            best, best_n = None, 0
            for key, held in self._held.items():
                n = min([limit] + [common_prefix(held.ids, p) for p in prompts])
                if n >= max(best_n, self.min_tokens, 1):
                    best, best_n = key, n
            if best is None:
                return None
            taken = self._held.pop(best)
            self.hits += 1
            self.reused_tokens += best_n * len(prompts)
        return taken.session, best_n

    def put(self, session: Any) -> None:
        """Keep `session` (its generation ended cleanly) for a later request, its servers
        told it is idle (their batchers do not wait for its steps meanwhile); the least
        recently used one beyond `max_sessions` is closed."""
        cache = self.model.cache_for(session)
        ids = cache.token_ids
        if session.closed or ids is None or ids.shape[0] != 1 or ids.shape[1] != session.position:
            session.close(wait=False)  # not a plain one-row token session: nothing to match
            return
        with self._lock:
            self._held[id(session)] = _Held(session, tuple(ids[0].tolist()), time.monotonic())
            dropped = []
            while len(self._held) > self.max_sessions:
                dropped.append(self._held.popitem(last=False)[1])
        if all(h.session is not session for h in dropped):  # max_sessions 0 drops it at once
            session.idle()
        for held in dropped:
            held.session.close(wait=False)

    def release_oldest(self) -> bool:
        """Close the least recently used held session and wait until its servers have freed
        its cache (room for a session a server refused); False when none is held."""
        held = self._oldest()
        if held is None:
            return False
        held.session.close(wait=True)
        return True

    async def make_room(self) -> bool:
        """`release_oldest` on the client's loop (InferenceSession's `make_room`)."""
        held = self._oldest()
        if held is None:
            return False
        await held.session.aclose()
        return True

    def _oldest(self) -> _Held | None:
        """The least recently used held session, out of the pool (counted as released)."""
        with self._lock:
            if not self._held:
                return None
            self.released += 1
            return self._held.popitem(last=False)[1]

    def close(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), OrderedDict()
        for h in held:
            h.session.close(wait=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def _expire(self) -> list[_Held]:
        """(Lock held) Remove the sessions idle past ttl_s; the caller closes them."""
        now = time.monotonic()
        old = [k for k, h in self._held.items() if now - h.since > self.ttl_s]
        return [self._held.pop(k) for k in old]
