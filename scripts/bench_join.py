"""Joining with nothing but a token: what a client with no copy of the model downloads, and
how long its first answer takes against one that has a local copy.

Makes `acme-chat-135m`, a directory of SmolLM2-135M-Instruct converted to safetensors
(float32), serves it with two `drift server` processes on 127.0.0.1 (blocks 0:15 and 15:30,
defaults: TLS), then runs `drift generate --initial_peers TOKEN "What is the capital of
France?"` in a client process with a fresh HOME and an empty working directory, `--reps`
times each, interleaved:
  - cold: a new HOME every time: the client parts come from the swarm (bytes and time
    printed by the client; the script checks them against the cache it left);
  - warm: the same HOME again: the parts come from its cache, nothing is downloaded;
  - local: `--model <the directory>`: the baseline, a client that has its own copy.
Each answer must contain "Paris". Then, in this process, `load_tokenizer('acme-chat-135m',
initial_peers=TOKEN)` + `from_pretrained('acme-chat-135m', initial_peers=TOKEN)` (an empty
cache dir) must generate the same greedy tokens as local transformers on the directory.
Prints medians and the ratios cold/local and warm/local.

    PYTHONPATH=. .venv/bin/python scripts/bench_join.py --reps 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from drift.models.checkpoint import open_checkpoint  # noqa: E402

NAME = "acme-chat-135m"
PROMPT = "What is the capital of France?"
DOWNLOADED = re.compile(r"downloaded ([\d.]+) MiB of client parts of \S+ in ([\d.]+)s")


def make_model_dir(root: Path, cache: Path) -> Path:
    """SmolLM2 converted once (float32) and copied as a plain directory named acme-chat-135m."""
    converted = open_checkpoint("smollm2", cache_dir=cache, dtype=torch.float32).path
    target = root / NAME
    shutil.copytree(converted, target, ignore=shutil.ignore_patterns("drift_source.json"))
    return target


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRIFT_", "HF_"))}
    return dict(env, HOME=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                PYTHONPATH=str(ROOT))  # fmt: skip


def start_servers(model: Path, tmp: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    procs, token = [], ""
    for start, end in ((0, 15), (15, 30)):
        log = tmp / f"server-{start}.log"
        cmd = [sys.executable, "-m", "drift.cli", "server", str(model), "--block_indices",
               f"{start}:{end}", "--host", "127.0.0.1", "--port", "0", "--throughput", "100",
               "--device", "cpu", "--torch_dtype", "float32",
               "--cache_dir", str(tmp / f"server-{start}")]  # fmt: skip
        if token:
            cmd += ["--initial_peers", token]
        with log.open("wb") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=out,
                                          env=clean_env(tmp / "server-home")))  # fmt: skip
        token = token or wait_for(log, r"join token: (drift://\S+)", procs[-1])
        wait_for(log, r"join token: ", procs[-1])
    return procs, token


def wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found.group(1) if found.groups() else found.group(0)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        time.sleep(0.3)
    raise TimeoutError(f"no {pattern!r} in {log}")


def wait_covered(token: str, timeout: float = 120) -> None:
    from drift.identity.tokens import parse_join_tokens
    from drift.swarm.reader import read_swarm_blocking

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        covs = read_swarm_blocking(parse_join_tokens(token)).coverages()
        if covs and not covs[0].missing:
            return
        time.sleep(0.5)
    raise TimeoutError("the two servers never covered the model")


def client(token: str, home: Path, work: Path, *extra: str) -> tuple[float, str, str]:
    """(wall seconds, stdout, stderr) of one `drift generate` in a clean HOME and cwd."""
    cmd = [sys.executable, "-m", "drift.cli", "generate", "--initial_peers", token, PROMPT,
           "--max_new_tokens", "16", *extra]  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=work, env=clean_env(home), capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    seconds = time.perf_counter() - started
    if out.returncode != 0 or "Paris" not in out.stdout:
        raise AssertionError(f"drift generate failed or did not say Paris:\n{out.stdout}\n"
                             f"{out.stderr}")  # fmt: skip
    return seconds, out.stdout, out.stderr


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sdk_check(token: str, model: Path, cache: Path) -> list[int]:
    """The SDK with no copy: the same greedy tokens as local transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drift import AutoDistributedModelForCausalLM, load_tokenizer

    tokenizer = load_tokenizer(NAME, initial_peers=token, cache_dir=cache)
    messages = [{"role": "user", "content": PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, return_tensors="pt")["input_ids"]  # fmt: skip
    local_tok = AutoTokenizer.from_pretrained(model)
    local_ids = local_tok.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=True, return_dict=True,
                                              return_tensors="pt")["input_ids"]  # fmt: skip
    assert torch.equal(ids, local_ids), "the swarm's tokenizer encodes differently"
    local = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=16, do_sample=False)
    with AutoDistributedModelForCausalLM.from_pretrained(
        NAME, initial_peers=token, cache_dir=cache
    ) as dist:
        out = dist.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(out, ref), (out, ref)
    print(
        f"SDK: load_tokenizer + from_pretrained({NAME!r}, initial_peers=...) generated the "
        f"same 16 greedy tokens as local transformers: {tokenizer.decode(out[0, ids.shape[1] :])!r}"
    )
    return out[0].tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="runs of each kind, interleaved")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-join-") as name:
        tmp = Path(name)
        model = make_model_dir(tmp / "models", tmp / "convert-cache")
        print(f"{NAME}: {tree_bytes(model) / 2**20:.1f} MiB on disk ({model})", flush=True)
        procs, token = start_servers(model, tmp)
        try:
            wait_covered(token)
            print(f"uptime: {os.getloadavg()}", flush=True)
            times: dict[str, list[float]] = {"cold": [], "warm": [], "local": []}
            downloaded: list[float] = []
            for rep in range(args.reps):
                home, work = tmp / f"home-{rep}", tmp / f"work-{rep}"
                work.mkdir()
                seconds, _, err = client(token, home, work)
                found = DOWNLOADED.search(err)
                assert found, err
                cached = tree_bytes(home / ".cache" / "drift" / "client-parts") / 2**20
                downloaded.append(float(found.group(1)))
                print(
                    f"cold  {seconds:6.1f}s  downloaded {found.group(1)} MiB in "
                    f"{found.group(2)}s (cache holds {cached:.1f} MiB)",
                    flush=True,
                )
                times["cold"].append(seconds)
                seconds, _, err = client(token, home, work)
                assert not DOWNLOADED.search(err), err
                times["warm"].append(seconds)
                print(f"warm  {seconds:6.1f}s  downloaded nothing", flush=True)
                seconds, _, _ = client(token, tmp / f"home-local-{rep}", work, "--model",
                                       str(model))  # fmt: skip
                times["local"].append(seconds)
                print(f"local {seconds:6.1f}s  (--model {model.name}: its own copy)", flush=True)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"\nmedians over {args.reps}: cold {med['cold']:.1f}s, warm {med['warm']:.1f}s, "
                  f"local copy {med['local']:.1f}s; cold/local {med['cold'] / med['local']:.2f}x, "
                  f"warm/local {med['warm'] / med['local']:.2f}x; downloaded "
                  f"{statistics.median(downloaded):.1f} MiB per cold join "
                  f"(the model directory: {tree_bytes(model) / 2**20:.1f} MiB)")  # fmt: skip
            sdk_check(token, model, tmp / "sdk-cache")
            print(f"uptime: {os.getloadavg()}")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
