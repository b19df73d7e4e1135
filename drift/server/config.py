"""ServerConfig: everything a block server needs to know, parsed once by drift/cli.

A frozen dataclass with a comment and a unit on every field; nothing here reads the
environment or touches torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from drift.wire.lora import check_adapter_names


@dataclass(frozen=True)
class ServerConfig:
    model: str  # alias, local checkpoint directory, .gguf file or Hub id (open_checkpoint)
    start_block: int | None = None  # first block served (absolute index); None: chosen
    end_block: int | None = None  # one past the last block served; None: chosen
    num_blocks: int | None = None  # how many blocks to serve when start/end are not pinned
    device: str = "auto"  # torch device name: auto | cpu | cuda[:i] | xpu | mps
    torch_dtype: str = "float32"  # weights and compute dtype: float32 | float16 | bfloat16
    # how the blocks' linear weights are stored: none | int8 | nf4 (bitsandbytes), or auto:
    # nf4 on CUDA, none elsewhere; norms, routers and activations stay in torch_dtype
    quant_type: str = "none"
    # KV-cache budget, in tokens per served block: a session reserves
    # max_length x batch_size tokens in each block of its (sub-)span, i.e.
    # max_length x batch_size x n_blocks block-tokens of attn_cache_tokens x span blocks.
    attn_cache_tokens: int = 8192
    # fraction (0, 1] of the KV-cache budget (block-tokens) one client (by its address) may
    # hold in all its sessions beyond its first; 1: no limit. The first session of a client
    # is bounded only by the budget and inference_max_length. Clients that prove the swarm
    # key (a private swarm's own) are not limited.
    client_cache_share: float = 0.5
    # seconds one unit of work may run on the compute thread before the server announces
    # itself degraded (routing avoids it) until that unit ends
    watchdog_s: float = 30.0
    max_batch_size: int = 8  # sequences per request or session
    inference_max_length: int = 2048  # tokens: largest max_length a session may open
    # seconds a graceful stop may spend handing live sessions to other servers (0: none)
    drain_timeout_s: float = 30.0
    session_timeout_s: float = 300.0  # seconds: an idle session is closed and its cache freed
    max_body_bytes: int = 64 << 20  # bytes: largest request body or WebSocket message (413)
    max_sockets: int = 512  # inference WebSockets open at once; more get 429 at the handshake
    max_request_tokens: int = 8192  # tokens (B x T) of one /forward or /backward (413 past it)
    # tokens per unit of compute (longer work is cut, others run between); None: sized to the
    # span's measured pace (drift.server.chunks.chunk_tokens_for)
    chunk_tokens: int | None = None
    # milliseconds a batch of concurrent sessions' steps waits after the latest step came for
    # those of sessions that stepped in the last second, at most 5x in all (they then run
    # together; 0: run what is queued)
    batch_wait_ms: float = 50.0
    max_json_bytes: int = 8 << 20  # bytes: largest plain-JSON /forward or /backward body (413)
    throughput: float | None = None  # block-tokens/s of one block; None: measured at start
    cache_dir: Path | None = None  # where the throughput measurement is cached (None: none)
    revision: str | None = None  # Hub revision of the model, when it comes from the Hub
    # how plain decode steps (one token per session) run (drift.server.compiled): off = eager
    # transformers; auto = the lean step (static KV room, layers called directly), compiled by
    # torch.compile on accelerators; on = compiled everywhere (a CPU needs a C++ compiler)
    compile: str = "auto"
    # torch threads plain decode steps run on: None = the faster of torch's own count and 1,
    # timed after pauses at start-up on a CPU (drift.server.decode_threads); 0 = torch's own
    # (OMP_NUM_THREADS where set); N = N
    decode_threads: int | None = None
    # float32 products of a few rows (decode steps, short prompts) on DRIFT's C kernel, built at
    # start-up with the machine's C compiler (drift.models.row_kernel); off: torch's BLAS
    row_kernel: bool = True
    # LoRA adapters served beside the base blocks: (name, peft adapter directory or Hub id)
    adapters: tuple[tuple[str, str], ...] = ()


def parse_adapters(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`NAME=PATH_OR_HUB_ID` or `PATH_OR_HUB_ID` -> (name, source); ValueError if bad."""
    pairs = []
    for value in values:
        name, sep, source = value.partition("=")
        if not sep:
            source, name = value, Path(value.rstrip("/")).name
        if not source:
            raise ValueError(f"--adapters {value!r}: give NAME=PATH or PATH")
        pairs.append((name, source))
    check_adapter_names(name for name, _ in pairs)
    return tuple(pairs)


def parse_decode_threads(value: str, environ: Mapping[str, str]) -> int | None:
    """ServerConfig.decode_threads from `--decode_threads` (auto or a count >= 1;
    ValueError if not): auto is None (measured), or 0 (torch's own) where the operator set
    OMP_NUM_THREADS in `environ`."""
    if value == "auto":
        return 0 if environ.get("OMP_NUM_THREADS", "").strip() else None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"--decode_threads {value!r}: use auto or a number of threads >= 1")
    return count
