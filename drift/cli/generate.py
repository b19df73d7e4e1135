"""`drift generate`: greedy (or sampled) text from a swarm, streamed to the terminal.

Opens the model's client pieces (embeddings, head, tokenizer: from --model when it names a
local copy or Hub id, else downloaded once from the swarm's servers and cached), wraps the
prompt in the chat template when the tokenizer has one, and streams tokens through a
TextStreamer while the swarm runs the blocks. Knows nothing about serving.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from drift.cli._exits import usage_errors
from drift.cli._options import add_cache_dir, add_initial_peers, add_swarm_key, add_torch_dtype
from drift.identity.swarm_key import resolve_swarm_key
from drift.identity.tokens import JoinToken, parse_join_tokens
from drift.wire.errors import BadRequest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text through a swarm",
        description="Generate a reply to PROMPT with the swarm's model, streaming tokens.",
    )
    p.add_argument("prompt", help="the prompt (wrapped in the chat template when there is one)")
    add_initial_peers(p, required=True)
    p.add_argument(
        "--model",
        default=None,
        help="the model: alias, local dir, .gguf or Hub id (a copy on this machine or the "
        "Hub), or a name or fingerprint the swarm announces (its client parts are downloaded "
        "from the servers once, then cached) (default: the swarm's only model)",
    )
    p.add_argument(
        "--max_new_tokens", type=int, default=64, help="tokens to generate (default: 64)"
    )
    p.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling threshold")
    p.add_argument("--no_chat_template", action="store_true", help="use the prompt as is")
    add_swarm_key(p)
    add_cache_dir(p)
    add_torch_dtype(p)
    p.set_defaults(func=run)


@dataclass(frozen=True)
class GenerateResult:
    text: str  # the generated text only (no prompt)
    new_tokens: int  # tokens generated
    seconds: float  # wall time of the generation
    route: list[tuple[str, str, int, int]] = field(default_factory=list)  # (peer, addr, start, end)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def encode_prompt(tokenizer: Any, prompt: str, *, chat: bool = True) -> Any:
    """input_ids [1, P]: the chat template with a generation prompt when the tokenizer has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        return ids["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


def load_client(model: str | None, tokens: tuple[JoinToken, ...], *, swarm_key: str | None,
                cache_dir: str | None, torch_dtype: str) -> tuple[Any, Any]:  # fmt: skip
    """(distributed model, tokenizer) for `model` (None: the swarm's only model), routed
    through the swarm behind `tokens`; says on stderr what it downloaded."""
    import torch

    from drift.client import AutoDistributedModelForCausalLM
    from drift.client.loading import open_client_model
    from drift.models.devices import parse_dtype

    # The CLI's "auto" is the flag's promise (float32 on CPU, where the head runs), not the
    # SDK's transformers-style "the checkpoint's dtype": a bfloat16 checkpoint would otherwise
    # run its head in bfloat16 beside float32 servers.
    dtype = parse_dtype(torch_dtype, torch.device("cpu"))
    resolved = open_client_model(
        model, cache_dir=cache_dir, dtype=dtype, initial_peers=list(tokens), swarm_key=swarm_key
    )  # opened once
    got = resolved.fetched
    if got is not None and got.bytes_downloaded:
        print(f"downloaded {got.bytes_downloaded / 2**20:.1f} MiB of client parts of "
              f"{resolved.ckpt.name} in {got.seconds:.1f}s from {got.source}",
              file=sys.stderr, flush=True)  # fmt: skip
    print(f"model {resolved.origin.describe()}", file=sys.stderr, flush=True)
    dist = AutoDistributedModelForCausalLM.from_pretrained(  # refused if the swarm's differs
        resolved, initial_peers=list(tokens), swarm_key=swarm_key, torch_dtype=dtype
    )
    try:
        tokenizer = resolved.ckpt.tokenizer()
    except BadRequest:
        dist.close()
        raise
    return dist, tokenizer


def generate(model: Any, tokenizer: Any, prompt: str, *, max_new_tokens: int,
             stream: bool = True, chat: bool = True, **sampling: Any) -> GenerateResult:  # fmt: skip
    """Generate a reply; with `stream`, tokens are printed to stdout as they arrive."""
    import torch
    from transformers import TextStreamer

    input_ids = encode_prompt(tokenizer, prompt, chat=chat)  # [1, P]
    streamer = (
        TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    max_length = int(input_ids.shape[1]) + max_new_tokens
    with torch.inference_mode(), model.inference_session(max_length=max_length) as session:
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            streamer=streamer,
            pad_token_id=pad,
            **sampling,
        )
        route = [(s.hop.peer_id, s.hop.addr, s.hop.start_block, s.hop.end_block)
                 for s in session.spans]  # fmt: skip
    seconds = time.perf_counter() - start
    new = out[0, input_ids.shape[1] :]  # [N]
    text = tokenizer.decode(new, skip_special_tokens=True)
    return GenerateResult(text, int(new.numel()), seconds, route)


def run(args: argparse.Namespace) -> int:
    with usage_errors():
        if args.max_new_tokens < 1:
            raise BadRequest("--max_new_tokens must be at least 1")
        tokens = parse_join_tokens(args.initial_peers)
        key = resolve_swarm_key(args.swarm_key, key_file=args.swarm_key_file, tokens=tokens)
    what = args.model or "the swarm's model"
    print(f"loading the client side of {what} ...", file=sys.stderr, flush=True)
    model, tokenizer = load_client(
        args.model,
        tokens,
        swarm_key=key,
        cache_dir=args.cache_dir,
        torch_dtype=args.torch_dtype,
    )
    sampling: dict[str, Any] = {"do_sample": args.do_sample}
    if args.do_sample:
        sampling.update(temperature=args.temperature, top_p=args.top_p)
    try:
        result = generate(
            model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
            chat=not args.no_chat_template, **sampling,
        )  # fmt: skip
    finally:
        model.close()
    print(f"[{result.new_tokens} tokens, {result.tokens_per_s:.1f} tokens/s]", file=sys.stderr)
    return 0
