"""Soak: chat clients through `drift api` and a fine-tuning client, while a server restarts.

Starts a TLS swarm of processes on 127.0.0.1 (a seed, server A for the first half of the
blocks, replicas B1 and B2 for the second half) and `drift api` in front of it, then for
--duration seconds runs --chat_clients chat clients (half of them streaming) against the API
and one prompt-tuning client (forward + backward through the swarm, SDK), while B1 and B2
take turns being stopped (SIGKILL, then SIGTERM, ...) and restarted with the same identity
every --restart_every seconds. Prints requests and errors by kind, the KV cache still held
once every client is gone (leaked), and each long-lived process's memory growth.

With --chaos an attacker runs issue 24's red-team findings (scripts/chaos.py: identity floods,
steered addresses, huge bodies, forged pushes, KV hogging, a long /forward, 7 MiB chat bodies,
deep schemas, 3,000 tools, cross-origin posts) every --chaos_every seconds beside the load, and
/health of the seed, server A and the API is timed every 50 ms. The run fails (exit 1) when a
cache is leaked, an attack gets a 5xx, /health fails, the listener the attacker announced is
sent anything but gossip, greedy chat answers differ, or a server is degraded at the end.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/soak.py --duration 120
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/soak.py --duration 180 --chaos
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
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.swarm.reader import read_swarm_blocking  # noqa: E402
from scripts.chaos import Findings, Target, run_chaos, unverified_tls  # noqa: E402
from tests.faults.procs import Member, dht, free_port, server, wait_online  # noqa: E402

API_KEY = "sk-soak"
EXAMPLES: dict[str, str] = {}  # an error message of each kind counted


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


def start_api(swarm: Swarm, port: int, log: list[str]) -> subprocess.Popen[str]:
    """`drift api` in front of the swarm; its WARNING and ERROR lines, and the servers its
    client stopped routing to (and why), go to `log`."""
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
            threading.Thread(target=_keep_warnings, args=(proc, log), daemon=True).start()
            return proc
    raise SystemExit("drift api did not start")


def _keep_warnings(proc: subprocess.Popen[str], log: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if " WARNING " in line or " ERROR " in line or "not routed to" in line:
            log.append(line.rstrip())


def common_lines(lines: list[str], top: int = 5) -> list[tuple[int, str]]:
    """The most frequent log lines, with timestamps, ids and numbers blanked out."""
    import re

    def shape(line: str) -> str:
        text = re.sub(r"12D3KooW\w+", "<peer>", line.split(" ", 2)[-1])
        return re.sub(r"\b[0-9a-f]{16,}\b|\b\d+(\.\d+)?\b", "#", text)[:240]

    shapes = Counter(shape(ln) for ln in lines)
    return [(n, text) for text, n in shapes.most_common(top)]


async def chat_client(url: str, stream: bool, stop: float, errors: Counter[str], done: Counter[str],
                      max_tokens: int, answers: Counter[str]) -> None:  # fmt: skip
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
                        code, message = "?", ""
                        with contextlib.suppress(Exception):
                            error = orjson.loads(data)["error"]
                            code, message = error.get("code") or "?", str(error.get("message"))
                        errors[f"chat HTTP {resp.status} {code}"] += 1
                        EXAMPLES.setdefault(f"chat HTTP {resp.status} {code}", message[:1200])
                        await asyncio.sleep(0.5)
                    elif stream and b"data: [DONE]" not in data:
                        errors["chat stream cut short"] += 1
                    else:
                        done["chat"] += 1
                        if not stream:  # temperature 0: every answer should be the same
                            answers[orjson.loads(data)["choices"][0]["message"]["content"]] += 1
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
    """Stop a replica every `every` s and restart it; logs how long until the seed trusts it
    again (under --chaos, while the seed's admission queue is being flooded)."""
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
        began = time.monotonic()
        victim.launch().wait_started()
        assert swarm.seed.token is not None
        try:
            wait_online(swarm.seed.token, {victim.peer_id}, timeout=120)
            back = f"online at the seed {time.monotonic() - began:.1f} s after its start"
        except AssertionError:
            back = "NOT online at the seed 120 s after its start"
        log.append(f"{time.strftime('%H:%M:%S')} {how} {victim.name}, restarted, {back}")
        i += 1


async def run_clients(args: argparse.Namespace, url: str, stop: float, errors: Counter[str],
                      done: Counter[str], answers: Counter[str]) -> None:  # fmt: skip
    await asyncio.gather(*(chat_client(url, i % 2 == 1, stop, errors, done, args.max_tokens,
                                       answers) for i in range(args.chat_clients)))  # fmt: skip


def chaos_target(swarm: Swarm, api_url: str, hidden_size: int, blocks: int) -> Target:
    assert swarm.seed.token is not None
    snap = read_swarm_blocking([swarm.seed.token])
    fingerprint = next(r.model_fingerprint for r in snap.live() if r.span is not None)
    return Target(
        seed_url=f"https://127.0.0.1:{swarm.seed.port}",
        server_urls=[f"https://127.0.0.1:{m.port}" for m in [swarm.a, swarm.replicas[0]]],
        api_url=api_url, api_key=API_KEY, fingerprint=str(fingerprint),
        hidden_size=hidden_size, num_blocks=blocks,
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="alias, dir or .gguf (default: smollm2)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    p.add_argument("--restart_every", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument("--chat_clients", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=16)
    p.add_argument(
        "--chaos",
        action="store_true",
        help="attack the swarm and the API beside the load (scripts/chaos.py)",
    )
    p.add_argument(
        "--chaos_every",
        type=float,
        default=15.0,
        help="seconds between the starts of two rounds of attacks (default 15)",
    )
    args = p.parse_args()
    from drift.models.checkpoint import open_checkpoint

    with tempfile.TemporaryDirectory(prefix="drift-soak-") as tmp:
        ckpt = open_checkpoint(args.model)
        swarm = Swarm(Path(tmp), str(ckpt.path), int(ckpt.config.num_hidden_layers))
        api = None
        api_log: list[str] = []
        try:
            print("starting the swarm ...", flush=True)
            swarm.start()
            api_port = free_port()
            api = start_api(swarm, api_port, api_log)
            url = f"http://127.0.0.1:{api_port}"
            errors: Counter[str] = Counter()
            done: Counter[str] = Counter()
            restarts: list[str] = []
            answers: Counter[str] = Counter()
            findings: Findings | None = None
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
            if args.chaos:
                target = chaos_target(swarm, url, int(ckpt.config.hidden_size),
                                      int(ckpt.config.num_hidden_layers))  # fmt: skip
                probe = {"seed": target.seed_url, "a": target.server_urls[0], "api": url}
                findings = Findings()
                threads.append(threading.Thread(target=run_chaos, args=(
                    target, stop, args.chaos_every, probe, findings)))  # fmt: skip
            for t in threads:
                t.start()
            print(f"load for {args.duration:.0f} s: {args.chat_clients} chat clients, 1 tuning "
                  f"client, a replica restarted every {args.restart_every:.0f} s", flush=True)  # fmt: skip
            asyncio.run(run_clients(args, url, stop, errors, done, answers))
            for t in threads:
                t.join(600)
            api.terminate()  # its held prefix sessions are not a leak: close them first
            api.wait(60)
            time.sleep(5)  # sessions of gone clients are freed at once; records follow
            wait_online(swarm.seed.token, {m.peer_id for m in swarm.members()[1:]}, timeout=120)  # type: ignore[arg-type]
            snap, freed_after = settle(swarm)
            end_health = health_at_end(swarm)
        finally:
            if api is not None:
                api.kill()
            for m in swarm.members():
                m.kill()
    print("\nrestarts:\n  " + "\n  ".join(restarts or ["none"]))
    print("done:", dict(done))
    print("errors by kind:", dict(errors) or "none")
    for kind, message in EXAMPLES.items():
        print(f"  e.g. {kind}: {message}")
    print(f"greedy chat answers: {sum(answers.values())}, distinct: {len(answers)}")
    print(f"drift api logged {len(api_log)} warnings, errors and bans; most common:")
    for n, text in common_lines(api_log):
        print(f"  {n:5d}  {text}")
    leaked = {r.peer_id[-8:]: (r.active_sessions, r.cache_tokens_total - r.cache_tokens_left)
              for r in snap.live() if r.span is not None}  # fmt: skip
    print(
        "after the load, per server (sessions open, cache tokens held):",
        leaked,
        f"({freed_after:.0f} s after the clients left)",
    )
    # the first quarter of the load is warm-up (allocator pools, first caches): growth after
    # it is what a leak would show
    print("memory (MiB RSS) at start of load -> after the first quarter -> end:")
    for name, series in rss.items():
        warm = series[len(series) // 4] if series else float("nan")
        print(f"  {name:5s} {series[0]:6.0f} -> {warm:6.0f} -> {series[-1]:6.0f}   growth after "
              f"warm-up {series[-1] - warm:+.0f}")  # fmt: skip
    failed = any(s or t for s, t in leaked.values()) or len(answers) > 1
    if findings is not None:
        print("\n" + "\n".join(findings.report()))
        degraded = [r.peer_id[-8:] for r in snap.live() if r.span is not None and r.degraded]
        print(f"at the end: /health {end_health}, degraded servers: {degraded or 'none'}")
        gossip_only = all(k.endswith("/swarm/gossip") for k in findings.listener_saw)
        failed = failed or bool(findings.server_errors() or findings.health_failures
                                or findings.crashed or degraded or not gossip_only
                                or any(s != 200 for s in end_health.values()))  # fmt: skip
    return 1 if failed else 0


def settle(swarm: Swarm) -> tuple[Any, float]:
    """The seed's table once no server holds a session, or after PARK_TIMEOUT_S + 15 s (a
    session handed to a replica that no client resumed waits that long for its client); the
    table and the seconds waited."""
    from drift.server.handoff_hub import PARK_TIMEOUT_S

    began = time.monotonic()
    while True:
        snap = read_swarm_blocking([swarm.seed.token])
        servers = [r for r in snap.live() if r.span is not None]
        idle = all(not r.active_sessions and r.cache_tokens_left == r.cache_tokens_total
                   for r in servers)  # fmt: skip
        waited = time.monotonic() - began
        if idle or waited > PARK_TIMEOUT_S + 15:
            return snap, waited + 5
        time.sleep(2)


def health_at_end(swarm: Swarm) -> dict[str, int]:
    """GET /health of every member once the load is over (status, or 0 when unreachable)."""
    import urllib.request

    ctx = unverified_tls()
    out = {}
    for m in swarm.members():
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{m.port}/health", context=ctx,
                                        timeout=10) as r:  # fmt: skip
                out[m.name] = r.status
        except OSError:
            out[m.name] = 0
    return out


if __name__ == "__main__":
    raise SystemExit(main())
