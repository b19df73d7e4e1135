"""The client's settings: one frozen object, built once and passed down.

Every network call the client makes takes its timeout from here; nothing reads the
environment. Units are in the field names (`_s` seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClientConfig:
    connect_timeout_s: float = 5.0  # opening a TCP connection / WebSocket handshake
    request_timeout_s: float = 60.0  # one /forward or /backward request end to end (at most)
    table_timeout_s: float = 5.0  # one read of a member's table (GET /swarm) end to end
    # One inference step's reply on a session WebSocket (and a /forward or /backward reply):
    # step_timeout_factor x what that peer's replies of that size have taken (with this
    # client's calls already in flight there), within [min_step_timeout_s, step_timeout_s];
    # step_timeout_s for a peer not measured yet.
    step_timeout_s: float = 60.0
    min_step_timeout_s: float = 2.0
    step_timeout_factor: float = 10.0
    # after a session's first step on a server (and at its end if none is left), a spare
    # socket to it is handshaken in the background and kept this long for the next session
    # there (drift.client.spares; 0: none)
    spare_socket_s: float = 20.0
    swarm_refresh_s: float = 5.0  # re-read the membership table at most this often
    max_retries: int = 4  # attempts per request / per step before giving up
    ban_base_s: float = 2.0  # first ban of a failing peer; doubles per failure
    ban_max_s: float = 60.0  # longest ban
    rtt_default_s: float = 0.01  # assumed round trip for a server not measured yet
    cache_penalty_s: float = 10.0  # added latency for a server short of KV-cache room
    push: bool = True  # inference steps go server to server (drift.wire.push), not via us
    # torch threads generate() runs on (the head, sampling: drift.client.head_threads): None =
    # the faster of torch's own count and 1, timed at load on a CPU; 0 = torch's own; N = N
    generate_threads: int | None = None
    # the head's float32 products of a few rows on DRIFT's C kernel, built at load with the
    # machine's C compiler (drift.models.row_kernel); False: torch's BLAS
    row_kernel: bool = True
    # activations on the wire (steps, /forward, /backward; replies come back alike): None as
    # computed, or float16 | bfloat16 | int8 (blockwise absmax), see drift.wire.compress
    wire_dtype: str | None = None
    # tokens per row of one inference message: a longer step (a long prompt) is sent in
    # chunks, pipelined along the chain of servers (0: one message, whatever its size)
    prefill_chunk_tokens: int = 512
    # bytes of hidden states per /forward (and its /backward): a bigger batch goes as groups
    # of rows, each its own chain of requests, all at once (0: one request, whatever its size)
    forward_chunk_bytes: int = 16 << 20
    compress_min_bytes: int = 1 << 20  # zstd-compress frames bigger than this (0 = never)
    swarm_key: str | None = field(default=None, repr=False)  # private swarm secret; None: open
    cache_headroom_tokens: int = 256  # tokens a forward's remote cache reserves past its
    # input (model(ids, use_cache=True)); it grows, doubling, when a later call needs more
