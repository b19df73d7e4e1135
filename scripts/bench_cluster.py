"""A model bigger than any machine: N box machines (tests/cluster/box.py) with `drift up` and
the printed `--join` command only, against local transformers with its weights in memory.

    PYTHONPATH=. python scripts/make_model.py llama-3.2-3b /tmp/llama3b
    sudo PYTHONPATH=. python scripts/bench_cluster.py /tmp/llama3b --memory_gib 3 --rtt_ms 0 20
    sudo PYTHONPATH=. python scripts/bench_cluster.py /tmp/llama3b --memory_gib 1.5 --quant_type nf4

The first machine runs `drift up MODEL --device cpu --torch_dtype DTYPE` (on a CPU `auto` is
float32, twice bf16's memory) and `--quant_type Q` when asked; the joiners run the printed
`--join` command only. With --quant_type the local reference is transformers with each decoder
layer's linears quantized as DRIFT quantizes them (drift.models.quant.quantize_layer).

Prints, per RTT: each machine's span and the budget it read, coverage, whether greedy tokens
equal local transformers, and decode seconds per token against local transformers (ratio =
local / drift, so >1 is faster). Machines join one after another, each once the previous serves.
The local model stays loaded: once the swarm serves, local and swarm runs alternate `--reps`
times and the medians are compared, so a drift in the host's load moves both sides alike.
With --churn, one more machine joins in the middle of a greedy session and then a machine that
session uses is SIGKILLed: the session's tokens must still equal local transformers'.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import ssl
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM
from tests.client.faults import AtStep
from tests.cluster.box import Box
from tests.cluster.swarm import (
    BUDGET_RE,
    JOIN_RE,
    MEMORY_RE,
    PEER_RE,
    covered,
    servers,
    wait_covered,
)

SERVING_RE = r"^serving blocks \[(\d+), (\d+)\)"


def step_seconds(addrs: list[str]) -> float:
    """Summed step latency of the servers at `addrs` so far (their /metrics)."""
    ctx = ssl.create_default_context()  # a TLS server's certificate names its peer id
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    total = 0.0
    for addr in addrs:
        with urllib.request.urlopen(f"{addr}/metrics", timeout=10, context=ctx) as resp:
            text = resp.read().decode()
        m = re.search(r"^drift_step_latency_seconds_sum (\S+)", text, re.M)
        total += float(m.group(1)) if m else 0.0
    return total


def decode_s_per_token(model, ids: torch.Tensor, new: int,
                       servers_s: Callable[[], float] | None = None):  # fmt: skip
    """(greedy tokens, seconds per decode step, the servers' summed step seconds per decode
    step or None): each the `new`-token run minus the 1-token run. `servers_s` reads the
    servers' summed step time so far. One untimed run first: a first generate() pays one-time
    warm-up (seconds on a CPU), which would otherwise come off the 1-token run."""
    model.generate(ids, max_new_tokens=2, do_sample=False)
    clocks = [(time.perf_counter(), servers_s() if servers_s else 0.0)]
    model.generate(ids, max_new_tokens=1, do_sample=False)
    clocks.append((time.perf_counter(), servers_s() if servers_s else 0.0))
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    clocks.append((time.perf_counter(), servers_s() if servers_s else 0.0))
    steps = out.shape[1] - ids.shape[1] - 1
    per = [((c[2] - c[1]) - (c[1] - c[0])) / steps for c in zip(*clocks, strict=True)]
    return out, per[0], per[1] if servers_s else None


def local_model(model_dir: Path, dtype: torch.dtype, quant: str):
    """Local transformers with its weights in memory; with `quant`, each decoder layer's
    linears quantized as DRIFT quantizes them."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    if quant != "none":
        from drift.models.quant import quantize_layer

        layers = model.model.layers
        for i, layer in enumerate(layers):
            layers[i] = quantize_layer(layer, quant, dtype, torch.device("cpu"))
    return model


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_box(args: argparse.Namespace, rtt: float, ref: torch.Tensor, ids: torch.Tensor,
            local: Any) -> dict:  # fmt: skip
    from transformers import AutoConfig

    n_blocks = AutoConfig.from_pretrained(args.model).num_hidden_layers
    flags = ["--device", "cpu", *(["--torch_dtype", args.dtype] if args.dtype_flag else []),
             *(["--quant_type", args.quant_type] if args.quant_type != "none" else [])]  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="drift-bench-cluster-"))
    with Box(args.machines + int(args.churn), workdir, memory=int(args.memory_gib * 2**30),
             rtt_ms=rtt, rate=args.rate, threads=args.threads) as box, logs_kept(box, workdir):  # fmt: skip
        rows, token_text = [], None
        for m in box.machines[: args.machines]:
            extra = flags if token_text is None else ["--join", token_text]
            proc = m.up(args.model, *extra)
            peer = proc.wait_for(PEER_RE, timeout=120).group(1)
            memory = proc.wait_for(MEMORY_RE, timeout=600).group(1)
            budget = proc.wait_for(BUDGET_RE, timeout=10).group(1)
            span = proc.wait_for(SERVING_RE, timeout=900)
            rows.append((m.name, peer, f"[{span.group(1)}, {span.group(2)})", budget, memory))
            if token_text is None:
                token_text = proc.wait_for(JOIN_RE, timeout=60).group(1)
        from drift.identity import parse_join_token

        assert token_text is not None, "no machine started"
        token = parse_join_token(token_text)
        wait_covered(token, n_blocks, {r[1] for r in rows}, timeout=300)
        # The client in the servers' dtype, as the local reference runs its head: the SDK's
        # default (float32) rounds differently from a bfloat16 head and can pick another token.
        model = AutoDistributedModelForCausalLM.from_pretrained(
            args.model, initial_peers=token_text, dtype=getattr(torch, args.dtype)
        )
        addrs = [r.addrs[0] for r in servers(token)]
        reps: list[tuple[float, float, float]] = []  # (local, drift, servers' step) s/token
        same = True
        try:
            for _ in range(args.reps):
                with torch.inference_mode():
                    _, local_s, _ = decode_s_per_token(local, ids, args.new_tokens)
                out, s, compute = decode_s_per_token(model, ids, args.new_tokens,
                                                     lambda: step_seconds(addrs))  # fmt: skip
                same = same and torch.equal(out, ref)
                reps.append((local_s, s, compute))
            events = churn(args, box, model, ids, ref, token_text, n_blocks) if args.churn else {}
        finally:
            model.close()
        ooms = [m.oom_kills() for m in box.machines]
        return dict(rows=rows, covered=covered(servers(token), n_blocks), same=same, reps=reps,
                    ooms=ooms, events=events, logs=workdir)  # fmt: skip


@contextlib.contextmanager
def logs_kept(box: Box, workdir: Path) -> Iterator[None]:
    """Each machine's `drift up` output kept as WORKDIR/<machine>-<n>.log when the run ends."""
    try:
        yield
    finally:
        for m in box.machines:
            for k, proc in enumerate(m.procs):
                (workdir / f"{m.name}-{k}.log").write_text(proc.output())


def churn(args: argparse.Namespace, box: Box, model: Any, ids: torch.Tensor, ref: torch.Tensor,
          token_text: str, n_blocks: int) -> dict:  # fmt: skip
    """One greedy session: after 3 tokens the box's last machine joins (`--join` only; the
    session waits until it serves), after 6 a machine the session uses whose blocks others
    also serve is SIGKILLed. Its tokens against local transformers', spans before and after,
    and its step times."""
    from drift.identity import parse_join_token

    token = parse_join_token(token_text)
    peers = {r.peer_id: r for r in servers(token)}
    before = {p: r.span for p, r in peers.items()}
    events: dict[str, Any] = {"before": before}
    machine_of: dict[str, Any] = {}
    for m in box.machines[: args.machines]:
        for proc in m.procs:
            found = re.search(PEER_RE.pattern, proc.output(), re.M)
            if found:
                machine_of[found.group(1)] = m

    def join() -> None:
        t0 = time.perf_counter()
        new = box.machines[-1]
        proc = new.up(args.model, "--join", token_text)
        peer = proc.wait_for(PEER_RE, timeout=120).group(1)
        span = proc.wait_for(SERVING_RE, timeout=900)
        machine_of[peer] = new
        wait_covered(token, n_blocks, set(before) | {peer}, timeout=120)
        events["joined"] = (new.name, f"[{span.group(1)}, {span.group(2)})",
                            time.perf_counter() - t0)  # fmt: skip

    killed: list[Any] = []

    def kill() -> None:
        used = {span.hop.peer_id for span in model._owned[0].session.spans}
        live = servers(token)
        for r in live:
            rest = [x for x in live if x.peer_id != r.peer_id]
            if r.peer_id in used and r.peer_id in machine_of and covered(rest, n_blocks):
                machine_of[r.peer_id].kill()
                killed.append(machine_of[r.peer_id])
                events["killed"] = (machine_of[r.peer_id].name, r.span)
                return

    stamps: list[float] = []

    def stamp() -> None:
        stamps.append(time.perf_counter())

    class Each(LogitsProcessor):
        def __call__(self, input_ids, scores):  # noqa: ANN001
            stamp()
            return scores

    hooks = LogitsProcessorList([Each(), AtStep(3, join), AtStep(6, kill)])  # stamp first
    out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False,
                         logits_processor=hooks)  # fmt: skip
    steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    # read from a machine still up: the one killed may be the seed the token names
    alive = [found.group(1) for m in box.machines if m not in killed for proc in m.procs
             if (found := JOIN_RE.search(proc.output()))]  # fmt: skip
    reader = parse_join_token(alive[0]) if alive else token
    events.update(same=torch.equal(out, ref), after={r.peer_id: r.span for r in servers(reader)},
                  steps=steps)  # fmt: skip
    return events


def churn_line(ev: dict) -> str:
    """The churn session, in one paragraph."""
    name, span, took = ev.get("joined", ("none", "-", 0.0))
    killed = ev.get("killed")
    moved = sorted(
        p[:12] for p, sp in ev["after"].items() if p in ev["before"] and ev["before"][p] != sp
    )
    steps = sorted(t for i, t in enumerate(ev["steps"]) if i != 2)  # [2]: the wait for the join
    median = steps[len(steps) // 2] if steps else 0.0
    return (
        f"churn: {name} joined mid-session serving {span} ({took:.1f} s from start to serving, "
        f"the session waiting); killed: {killed or 'none (no machine the session used could go)'}; "
        f"servers that moved span: {moved or 'none'}; tokens identical to local: {ev['same']}; "
        f"median step {median:.3f} s, the step after the kill "
        f"{ev['steps'][5] if len(ev['steps']) > 5 else float('nan'):.3f} s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--machines", type=int, default=3)
    p.add_argument("--memory_gib", type=float, default=3.0)
    p.add_argument("--rtt_ms", type=float, nargs="+", default=[0.0, 20.0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--no_dtype_flag",
        dest="dtype_flag",
        action="store_false",
        help="start the first machine without --torch_dtype (on a CPU, auto is float32)",
    )
    p.add_argument("--quant_type", default="none", choices=["none", "int8", "nf4"],
                   help="passed to the first machine (the joiners follow the swarm)")  # fmt: skip
    p.add_argument("--new_tokens", type=int, default=12)
    p.add_argument("--reps", type=int, default=3,
                   help="interleaved local/swarm runs per RTT; medians are compared")  # fmt: skip
    p.add_argument("--churn", action="store_true",
                   help="then a session where a machine more joins after 3 tokens and, after 6, "
                        "one the session uses is SIGKILLed (blocks others also serve)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="each machine's OMP_NUM_THREADS (default: unset, torch's default of "
                        "every core, as users run it; one session computes on one machine "
                        "at a time)")  # fmt: skip
    args = p.parse_args()
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 1345, 30]])
    local = local_model(args.model, getattr(torch, args.dtype), args.quant_type)
    with torch.inference_mode():
        ref, local_s, _ = decode_s_per_token(local, ids, args.new_tokens)
    quant = f", {args.quant_type}" if args.quant_type != "none" else ""
    print(f"local transformers ({args.dtype}{quant}, weights in memory, "
          f"{torch.get_num_threads()} threads), alone on the host: {local_s:.3f} s/token")  # fmt: skip
    for rtt in args.rtt_ms:
        r = run_box(args, rtt, ref, ids, local)
        threads = "torch's default threads" if args.threads is None else f"{args.threads} threads"
        print(f"\n{args.machines} machines x {args.memory_gib} GiB{quant}, RTT {rtt:g} ms, "
              f"{args.rate}, {threads}:")  # fmt: skip
        print("| machine | span | budget read | sizing |")
        print("|---|---|---|---|")
        for name, _, span, budget, memory in r["rows"]:
            print(f"| {name} | {span} | {budget} | {memory} |")
        print(
            f"coverage full: {r['covered']}; greedy tokens identical to local: {r['same']}; "
            f"OOM kills: {sum(r['ooms'])}"
        )
        print("| rep | local s/token | drift s/token | servers' summed step | local/drift |")
        print("|---|---:|---:|---:|---:|")
        for i, (lo, dr, co) in enumerate(r["reps"], 1):
            print(f"| {i} | {lo:.3f} | {dr:.3f} | {co:.3f} | {lo / dr:.2f}x |")
        lo, dr, co = (median([x[k] for x in r["reps"]]) for k in range(3))
        ratio = median([x[0] / x[1] for x in r["reps"]])
        print(
            f"decode, medians of {len(r['reps'])} interleaved runs: drift {dr:.3f} s/token vs "
            f"local {lo:.3f} s/token (median ratio local/drift {ratio:.2f}x); the servers' "
            f"summed step time {co:.3f} s/token, the rest (client head, generate(), wire) "
            f"{dr - co:.3f}",
            flush=True,
        )
        if r["events"]:
            print(churn_line(r["events"]), flush=True)
        print(f"each machine's output: {r['logs']}/m*.log", flush=True)


if __name__ == "__main__":
    main()
