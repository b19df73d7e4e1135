"""Soak: chat clients through `drift api` and a fine-tuning client, while a server restarts.

Starts a TLS swarm of processes on 127.0.0.1 (a seed, server A for the first half of the
blocks, replicas B1 and B2 for the second half) and `drift api` in front of it, then for
--duration seconds runs --chat_clients chat clients (half of them streaming) against the API
and one prompt-tuning client (forward + backward through the swarm, SDK), while B1 and B2
take turns being stopped (SIGKILL, then SIGTERM, ...) and restarted with the same identity
every --restart_every seconds. Prints requests and errors by kind, the KV cache still held
once every client is gone (leaked), and each long-lived process's memory growth.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/soak.py --duration 120
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.swarm.reader import read_swarm_blocking  # noqa: E402
from tests.faults.procs import Member, dht, free_port, server, wait_online  # noqa: E402

API_KEY = "sk-soak"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Swarm:
    def __init__(self, work: Path, model: str, blocks: int) -> None:
        half = blocks // 2
        self.seed = dht("seed", work)
        self.a = server("a", work, Path(model), 0, half, None)
        self.replicas = [server(f"b{i}", work, Path(model), half, blocks, None) for i in (1, 2)]
        self.work, self.model = work, model

    def members(self) -> list[Member]:
        return [self.seed, self.a, *self.replicas]

    def start(self) -> None:
        self.seed.start()
        for m in [self.a, *self.replicas]:
            m.args += ["--initial_peers", str(self.seed.token)]
            m.launch()
        for m in [self.a, *self.replicas]:
            m.wait_started()
        wait_online(self.seed.token, {m.peer_id for m in [self.a, *self.replicas]}, timeout=300)  # type: ignore[arg-type]


def start_api(swarm: Swarm, port: int) -> subprocess.Popen[str]:
    env = dict(os.environ, DRIFT_API_KEY=API_KEY, PYTHONPATH=str(Path.cwd()), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "drift.cli", "api", swarm.model, "--initial_peers",
         str(swarm.seed.token), "--host", "127.0.0.1", "--port", str(port),
         "--served_model_name", "soak"],
        env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if "OpenAI-compatible API" in line:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc
    raise SystemExit("drift api did not start")


async def chat_client(url: str, stream: bool, stop: float, errors: Counter[str], done: Counter[str],
                      max_tokens: int) -> None:  # fmt: skip
    body = {"model": "soak", "messages": [{"role": "user", "content": "Name a river."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}  # fmt: skip
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with aiohttp.ClientSession(headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:  # fmt: skip
        while time.monotonic() < stop:
            try:
                async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                    data = await resp.read()
                    if resp.status != 200:
                        code = "?"
                        with contextlib.suppress(Exception):
                            code = orjson.loads(data)["error"].get("code") or "?"
                        errors[f"chat HTTP {resp.status} {code}"] += 1
                        await asyncio.sleep(0.5)
                    elif stream and b"data: [DONE]" not in data:
                        errors["chat stream cut short"] += 1
                    else:
                        done["chat"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                errors[f"chat {type(exc).__name__}"] += 1
                await asyncio.sleep(0.5)


def tune_client(model_path: str, token: str, stop: float, errors: Counter[str],
                done: Counter[str]) -> None:  # fmt: skip
    import torch

    from drift.client import AutoDistributedModelForCausalLM
    from drift.wire.errors import DriftError

    model = AutoDistributedModelForCausalLM.from_pretrained(
        model_path, initial_peers=token, tuning_mode="ptune", pre_seq_len=4
    )
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    try:
        while time.monotonic() < stop:
            try:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                done["tune step"] += 1
            except DriftError as exc:
                errors[f"tune {exc.code}"] += 1
                time.sleep(0.5)
            except Exception as exc:  # noqa: BLE001 -- counted, the soak goes on
                errors[f"tune {type(exc).__name__}"] += 1
                time.sleep(0.5)
    finally:
        model.close()


def sample_rss(pids: dict[str, int], rss: dict[str, list[float]], stop: float) -> None:
    """RSS of each long-lived process every 5 s until `stop` (and once after)."""
    while True:
        for name, pid in pids.items():
            rss[name].append(rss_mb(pid))
        if time.monotonic() >= stop:
            return
        time.sleep(min(5.0, max(0.0, stop - time.monotonic())))


def restarter(swarm: Swarm, every: float, stop: float, log: list[str]) -> None:
    i = 0
    while time.monotonic() + every < stop:
        time.sleep(every)
        victim = swarm.replicas[i % 2]
        how = "SIGKILL" if i % 2 == 0 else "SIGTERM"
        assert victim.proc is not None
        if how == "SIGKILL":
            victim.kill()
        else:
            victim.proc.popen.send_signal(signal.SIGTERM)
            victim.proc.popen.wait(60)
        victim.launch().wait_started()
        log.append(f"{time.strftime('%H:%M:%S')} {how} {victim.name}, restarted")
        i += 1


async def run_clients(args: argparse.Namespace, url: str, stop: float, errors: Counter[str],
                      done: Counter[str]) -> None:  # fmt: skip
    await asyncio.gather(*(chat_client(url, i % 2 == 1, stop, errors, done, args.max_tokens)
                           for i in range(args.chat_clients)))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="alias, dir or .gguf (default: smollm2)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    p.add_argument("--restart_every", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument("--chat_clients", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=16)
    args = p.parse_args()
    from drift.models.checkpoint import open_checkpoint

    with tempfile.TemporaryDirectory(prefix="drift-soak-") as tmp:
        ckpt = open_checkpoint(args.model)
        swarm = Swarm(Path(tmp), str(ckpt.path), int(ckpt.config.num_hidden_layers))
        api = None
        try:
            print("starting the swarm ...", flush=True)
            swarm.start()
            api_port = free_port()
            api = start_api(swarm, api_port)
            url = f"http://127.0.0.1:{api_port}"
            errors: Counter[str] = Counter()
            done: Counter[str] = Counter()
            restarts: list[str] = []
            steady = [swarm.seed, swarm.a]
            pids = {m.name: m.proc.popen.pid for m in steady if m.proc} | {"api": api.pid}
            rss: dict[str, list[float]] = {name: [] for name in pids}
            stop = time.monotonic() + args.duration
            threads = [
                threading.Thread(target=tune_client, args=(str(ckpt.path), str(swarm.seed.token),
                                                           stop, errors, done)),
                threading.Thread(target=restarter, args=(swarm, args.restart_every, stop, restarts)),
                threading.Thread(target=sample_rss, args=(pids, rss, stop)),
            ]  # fmt: skip
            for t in threads:
                t.start()
            print(f"load for {args.duration:.0f} s: {args.chat_clients} chat clients, 1 tuning "
                  f"client, a replica restarted every {args.restart_every:.0f} s", flush=True)  # fmt: skip
            asyncio.run(run_clients(args, url, stop, errors, done))
            for t in threads:
                t.join(600)
            time.sleep(5)  # sessions of gone clients are freed at once; records follow
            wait_online(swarm.seed.token, {m.peer_id for m in swarm.members()[1:]}, timeout=120)  # type: ignore[arg-type]
            snap = read_swarm_blocking([swarm.seed.token])
        finally:
            if api is not None:
                api.kill()
            for m in swarm.members():
                m.kill()
    print("\nrestarts:\n  " + "\n  ".join(restarts or ["none"]))
    print("done:", dict(done))
    print("errors by kind:", dict(errors) or "none")
    leaked = {r.peer_id[-8:]: (r.active_sessions, r.cache_tokens_total - r.cache_tokens_left)
              for r in snap.live() if r.span is not None}  # fmt: skip
    print("after the load, per server (sessions open, cache tokens held):", leaked)
    # the first quarter of the load is warm-up (allocator pools, first caches): growth after
    # it is what a leak would show
    print("memory (MiB RSS) at start of load -> after the first quarter -> end:")
    for name, series in rss.items():
        warm = series[len(series) // 4] if series else float("nan")
        print(f"  {name:5s} {series[0]:6.0f} -> {warm:6.0f} -> {series[-1]:6.0f}   growth after "
              f"warm-up {series[-1] - warm:+.0f}")  # fmt: skip
    return 1 if any(s or t for s, t in leaked.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
