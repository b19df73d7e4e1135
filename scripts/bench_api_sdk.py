"""One user through `drift api` (its defaults: held prefix sessions on) against the SDK's
generate() on the same swarm: decode tokens/s, first chat turn and a second turn that
continues the first, and the second turn's time to first token against a cold one.

Real processes on 127.0.0.1: a seed (`drift dht`), two `drift server`s over the halves of
SmolLM2's blocks (0:15 / 15:30), `drift api` with its defaults and `drift api
--prefix_sessions 0` (the cold second turn); the SDK runs in this process. Greedy,
at most `--new` tokens (both stop at EOS, on the same tokens). Per rep, with a
new question each time: SDK turn 1 and turn 2, API turn 1 and turn 2 (streamed), cold API
turn 2. Decode tokens/s = tokens after the first / time from the first to the last token;
medians of `--reps` after one warm-up rep. Every process gets OMP_NUM_THREADS=1 (2-core
machine; a decode is a pipeline, one process computes at a time).

    PYTHONPATH=. python scripts/bench_api_sdk.py --reps 3 --new 48
    PYTHONPATH=. python scripts/bench_api.py --vs_sdk        # the same
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("DRIFT_ROOT") or Path(__file__).resolve().parents[1])  # drift to run
sys.path.insert(0, str(ROOT))
KEY = "bench"
SYSTEM = "You are a helpful assistant who answers about European cities."


class Procs:
    """The seed, the servers and the API processes; logs under `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}  # fmt: skip

    def start(self, name: str, args: list[str], pattern: str) -> re.Match[str]:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "drift.cli", *args], stdout=out,
                                    stderr=out, env=self.env, cwd=ROOT)  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            found = re.search(pattern, log.read_text(errors="replace"))
            if found:
                return found
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        raise TimeoutError(f"{name}: no {pattern!r} in {log}")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def swarm(procs: Procs, model: str, n: int, tls: bool = False) -> tuple[str, list[str]]:
    """Seed + two servers (plain HTTP unless `tls`); the join token and the servers' URLs."""
    net = ["--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--cache_dir", str(procs.tmp)]
    net += [] if tls else ["--plain_http"]
    token = procs.start("seed", ["dht", *net], r"join token: (\S+)").group(1)
    urls: list[str] = []
    for start, end in ((0, n // 2), (n // 2, n)):
        procs.start(f"server-{start}", ["server", model, "--block_indices", f"{start}:{end}",
                                        "--throughput", "100", "--initial_peers", token, *net],
                    r"join token: (\S+)")  # fmt: skip
        text = (procs.tmp / f"server-{start}.log").read_text(errors="replace")
        port = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        assert port, text
        urls.append(f"{'https' if tls else 'http'}://127.0.0.1:{port.group(1)}")
    return token, urls


def batch_waits(urls: list[str]) -> str:
    """Each server's step-batch waits and vain waits (drift_batch_* on /metrics)."""
    out = []
    for url in urls:
        try:
            ctx = ssl._create_unverified_context()  # the servers' self-signed certificates
            with urllib.request.urlopen(f"{url}/metrics", timeout=10, context=ctx) as resp:
                text = resp.read().decode()
        except OSError as exc:
            out.append(f"{url}: {exc}")
            continue
        found = dict(re.findall(r"^(drift_batch_\w+_total) (\S+)", text, re.M))
        waits = found.get("drift_batch_waits_total", "n/a")
        vain = found.get("drift_batch_vain_waits_total", "n/a")
        out.append(f"{waits} waits, {vain} vain")
    return "; ".join(out)


def api(procs: Procs, name: str, model: str, token: str, extra: list[str]) -> str:
    args = ["api", model, "--initial_peers", token, "--port", "0", "--api_key", KEY,
            "--served_model_name", "bench", *extra]  # fmt: skip
    return procs.start(name, args, r"on (http://\S+)/v1").group(1)


class Stamps:
    """A generate() streamer: the time of each new token (the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def sdk_turn(model: Any, tokenizer: Any, messages: list[dict], new: int) -> tuple[dict, str]:
    import torch

    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    stamps = Stamps()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, do_sample=False,
                             streamer=stamps)  # fmt: skip
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return _rates(start, stamps.times), answer


def api_turn(url: str, messages: list[dict], new: int) -> tuple[dict, str]:
    body = {"model": "bench", "messages": messages, "max_tokens": new, "temperature": 0,
            "stream": True}  # fmt: skip
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {KEY}",
                                          "Content-Type": "application/json"})  # fmt: skip
    start, times, answer, hops = time.perf_counter(), [], "", 0
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            hops = len(chunk.get("drift_route") or []) or hops
            choices = chunk.get("choices") or [{}]
            delta = choices[0].get("delta", {}).get("content")
            if delta:
                times.append(time.perf_counter())
                answer += delta
    return {**_rates(start, times), "hops": hops}, answer


def _rates(start: float, times: list[float]) -> dict:
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return {"ttft": times[0] - start if times else float("nan"), "tps": decode,
            "n": len(times)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument(
        "--tls",
        action="store_true",
        help="TLS between nodes (the default of drift; plain HTTP here unless given)",
    )
    parser.add_argument("--api_flags", default="", help="more flags for the default `drift api`")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from drift.client import AutoDistributedModelForCausalLM
    from drift.models.checkpoint import open_checkpoint

    torch.set_num_threads(1)
    ckpt = open_checkpoint(args.model)
    n = ckpt.config.num_hidden_layers
    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp))
        try:
            token, servers = swarm(procs, str(ckpt.path), n, args.tls)
            url = api(procs, "api", str(ckpt.path), token, args.api_flags.split())
            cold_url = api(procs, "api-cold", str(ckpt.path), token, ["--prefix_sessions", "0"])
            model = AutoDistributedModelForCausalLM.from_pretrained(ckpt.path,
                                                                    initial_peers=token)  # fmt: skip
            rows: dict[str, list[dict]] = {}
            for rep in range(args.reps + 1):  # rep 0 warms every path up
                first = [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Tell me about bridge number {rep}."}]  # fmt: skip
                got: dict[str, dict] = {}
                got["sdk 1"], answer = sdk_turn(model, tokenizer, first, args.new)
                second = [*first, {"role": "assistant", "content": answer},
                          {"role": "user", "content": "And the markets there?"}]  # fmt: skip
                got["sdk 2"], _ = sdk_turn(model, tokenizer, second, args.new)
                got["api 1"], api_answer = api_turn(url, first, args.new)
                api_second = [*first, {"role": "assistant", "content": api_answer},
                              {"role": "user", "content": "And the markets there?"}]  # fmt: skip
                got["api 2"], _ = api_turn(url, api_second, args.new)
                got["cold api 2"], _ = api_turn(cold_url, api_second, args.new)
                print(f"rep {rep}{' (warm-up)' if rep == 0 else ''}: " + ", ".join(
                    f"{k} {v['tps']:.1f} tok/s ttft {v['ttft'] * 1e3:.0f} ms"
                    + (f" ({v['hops']} hops)" if "hops" in v else "")
                    for k, v in got.items()), flush=True)  # fmt: skip
                if rep:
                    for k, v in got.items():
                        rows.setdefault(k, []).append(v)
            model.close()
            print(f"servers' step batches: {batch_waits(servers)}")
        finally:
            procs.stop()
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("tps", "ttft")}
           for k, v in rows.items()}  # fmt: skip
    print(
        f"\n{args.model}, seed + servers 0:{n // 2} / {n // 2}:{n} on loopback, greedy "
        f"{args.new} tokens, medians of {args.reps}"
    )
    print("| run | decode tokens/s | time to first token |")
    print("| --- | --- | --- |")
    for k, v in med.items():
        print(f"| {k} | {v['tps']:.2f} | {v['ttft'] * 1e3:.0f} ms |")
    print(
        f"API/SDK decode: turn 1 {med['api 1']['tps'] / med['sdk 1']['tps']:.2f}x, "
        f"turn 2 {med['api 2']['tps'] / med['sdk 2']['tps']:.2f}x; second-turn TTFT "
        f"{med['api 2']['ttft'] * 1e3:.0f} ms reused vs {med['cold api 2']['ttft'] * 1e3:.0f}"
        f" ms cold ({med['api 2']['ttft'] / med['cold api 2']['ttft']:.2f}x)"
    )


if __name__ == "__main__":
    main()
