"""Server memory of concurrent sessions against what the KV budget reserves for them.

Two `drift server` processes (SmolLM2 float32, blocks split in half, one compute thread each)
on 127.0.0.1; `--sessions` SDK sessions in threads of one client, each a greedy generate() of
`--new` tokens after its own random `--prompt`-token prompt, all open at once (their decode
steps run batched on the servers). With every session still open, for each server: the
block-tokens its budget reserved (`/blocks`), their bytes (keys and values, float32), the
bytes the sessions' tokens take, and the growth of the process's resident memory (VmRSS) and
of its peak (VmHWM) over the same server before the sessions opened. A per-step copy of the
pasts (a temporary batched cache) would show as a peak, and, since freed memory mostly stays
mapped, as resident growth well above the tokens' bytes. Also checks each session's tokens
against local transformers on the same weights. The prompts go in one at a time (so the
resident growth after them is the prompts' alone), then every session decodes at once. With
`--together` every session starts its generate() at once instead (the sessions whose prompt is
in decode while the others' prompt chunks queue on the servers: the load under which a client
once gave up on a busy server); the count of servers the clients gave up on is printed.
`--clients N` spreads the sessions over N SDK clients (models) of their own, as separate
processes or machines would be: none knows the calls the others have queued on a server.

    PYTHONPATH=. .venv/bin/python scripts/bench_kv_memory.py --sessions 8 --prompt 1000 --new 24
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402

MIB = 1 << 20


def proc_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def reserved(url: str) -> int:
    with urllib.request.urlopen(f"{url}/blocks", timeout=10) as resp:
        info = json.loads(resp.read())
    return int(info["cache_block_tokens_total"]) - int(info["cache_block_tokens_left"])


def counting(note_failure: Any, failures: list[str]) -> Any:
    """A client's note_failure that also records the peer it gave up on."""

    def counted(exc: BaseException, hop: Any) -> None:
        failures.append(hop.peer_id)
        note_failure(exc, hop)

    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--together", action="store_true",
                        help="send every session's prompt at once, not one at a time")  # fmt: skip
    parser.add_argument("--clients", type=int, default=1,
                        help="SDK clients the sessions are spread over (default: 1)")  # fmt: skip
    args = parser.parse_args()
    ckpt = open_checkpoint(args.model)
    text = ckpt.config.get_text_config()
    n, vocab = int(text.num_hidden_layers), int(text.vocab_size)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_block_token = 2 * int(text.num_key_value_heads) * int(head_dim) * 4  # K and V, float32
    length = args.prompt + args.new
    # room for these sessions and one more (the warm-up's, while it closes), all of it open
    # to this one client
    flags = ("--inference_max_length", str(length), "--attn_cache_tokens",
             str((args.sessions + 1) * length), "--client_cache_share", "1")  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (1, args.prompt), generator=gen)
               for _ in range(args.sessions)]  # fmt: skip
    local = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = [local.generate(p, max_new_tokens=args.new, do_sample=False) for p in prompts]
    del local
    spans = [(0, n // 2), (n // 2, n)]
    with tempfile.TemporaryDirectory() as tmp:
        procs = ServerProcs(str(ckpt.path), spans, Path(tmp), flags)
        models: list[Any] = []
        try:
            failures: list[str] = []  # servers a client gave up on (a step timed out...)
            for _ in range(args.clients):
                models.append(AutoDistributedModelForCausalLM.from_pretrained(
                    ckpt.path, initial_peers=procs.token))  # fmt: skip
                wait_covered(models[-1], n)
                models[-1].client.note_failure = counting(models[-1].client.note_failure,
                                                          failures)  # fmt: skip
            model = models[0]
            model.generate(prompts[0][:, :32], max_new_tokens=4, do_sample=False)  # warm-up
            before = [proc_kib(p.pid) for p in procs.procs]
            got: list[torch.Tensor | None] = [None] * args.sessions
            done = threading.Barrier(args.sessions + 1)
            leave = threading.Event()

            prefill = threading.Lock()
            prefilled = threading.Barrier(args.sessions + 1)
            go = threading.Event()

            def user(i: int) -> None:
                model = models[i % len(models)]
                try:
                    with model.inference_session(max_length=length) as session:
                        if not args.together:
                            with prefill:  # one prompt at a time
                                model(prompts[i][:, :-1], cache=model.cache_for(session),
                                      use_cache=True)  # fmt: skip
                        prefilled.wait()  # then all decode at once, batched
                        go.wait()
                        got[i] = model.generate(prompts[i], max_new_tokens=args.new,
                                                do_sample=False)  # fmt: skip
                        done.wait()
                        leave.wait()
                except BaseException:
                    prefilled.abort()  # the main thread stops waiting
                    done.abort()
                    raise

            threads = [threading.Thread(target=user, args=(i,)) for i in range(args.sessions)]
            for t in threads:
                t.start()
            prefilled.wait(timeout=1800)
            prompted = [proc_kib(p.pid) for p in procs.procs]
            go.set()
            done.wait(timeout=1800)
            during = [proc_kib(p.pid) for p in procs.procs]
            held = [reserved(url) for url in procs.urls]
            leave.set()
            for t in threads:
                t.join()
            steps = procs.step_seconds()
        finally:
            for m in models:
                m.close()
            procs.stop()
    same = all(g is not None and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    print(f"\n{args.model} float32, 2 servers {spans}, {args.sessions} sessions of "
          f"{args.prompt} prompt + {args.new} new tokens, all open (decode steps batched), "
          f"{'every generate() at once' if args.together else 'prompts one at a time'}, "
          f"{args.clients} client(s)")  # fmt: skip
    print("| server | blocks | budget reserved | its K/V bytes | sessions' tokens' K/V | "
          "VmRSS growth: prompts in | then decoded | VmHWM growth | steps (count) |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, (start, end) in enumerate(spans):
        blocks = end - start
        tokens_bytes = args.sessions * length * blocks * per_block_token
        rss = (during[i]["VmRSS"] - before[i]["VmRSS"]) * 1024
        mid = (prompted[i]["VmRSS"] - before[i]["VmRSS"]) * 1024
        hwm = (during[i]["VmHWM"] - before[i]["VmHWM"]) * 1024
        mid_text = "-" if args.together else f"{mid / MIB:.1f} MiB"
        print(f"| {i + 1} | {start}:{end} | {held[i]:,} block-tokens | "
              f"{held[i] * per_block_token / MIB:.1f} MiB | {tokens_bytes / MIB:.1f} MiB | "
              f"{mid_text} | {rss / MIB:.1f} MiB | {hwm / MIB:.1f} MiB | "
              f"{steps[i][1]} |")  # fmt: skip
    print(f"tokens equal local transformers: {same}; servers given up on (then failed over "
          f"from): {len(failures)}")  # fmt: skip


if __name__ == "__main__":
    main()
