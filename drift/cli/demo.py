"""`drift demo`: a three-server swarm on loopback, one answer through it, then teardown.

Starts `drift up` subprocesses over overlapping spans of the demo model, waits until the
blocks are covered, generates a reply with the client SDK (chat template), prints which
server ran which blocks, the tokens/s and the dashboard URL, and stops what it started
(unless --keep). Knows the servers only through their process records and output.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from drift.cli._exits import UsageError
from drift.cli._options import add_cache_dir, add_model
from drift.cli.procs import read_records
from drift.cli.server import add_quant_type
from drift.paths import resolve_cache_dir
from drift.wire.errors import DriftError

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a local three-server swarm and generate through it",
        description="Start three servers on loopback covering the demo model in overlapping "
        "spans, generate an answer through them, and stop them again.",
    )
    p.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="what to ask the model")
    add_model(p, positional=False)
    p.add_argument("--num_servers", type=int, default=3, help="servers to start (default: 3)")
    p.add_argument("--max_new_tokens", type=int, default=48, help="tokens to generate")
    p.add_argument("--keep", action="store_true", help="leave the swarm running (stop: drift down)")
    add_cache_dir(p)
    add_quant_type(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the swarm")
    p.set_defaults(func=run)


def overlapping_spans(num_blocks: int, num_servers: int) -> list[tuple[int, int]]:
    """`num_servers` spans covering [0, num_blocks), neighbours overlapping by ~10%."""
    if not 0 < num_servers <= num_blocks:
        raise ValueError(f"cannot split {num_blocks} blocks over {num_servers} servers")
    overlap = max(1, num_blocks // 10) if num_servers > 1 else 0
    spans = []
    for i in range(num_servers):
        start = i * num_blocks // num_servers
        end = (i + 1) * num_blocks // num_servers
        spans.append((max(0, start - overlap if i else 0), end))
    return spans


def _start(args: list[str], env: dict[str, str], log_dir: Path, i: int) -> subprocess.Popen[bytes]:
    log = open(log_dir / f"server-{i}.log", "wb")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen([sys.executable, "-m", "drift", *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT / SIGTERM until the block ends (where the platform can: POSIX)."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _wait_token(proc: subprocess.Popen[bytes], cache: Path, deadline: float) -> str:
    """The join token of the `drift up` process `proc`, from its process record."""
    while time.monotonic() < deadline:
        for _, rec in read_records(cache):
            if rec is not None and rec.pid == proc.pid and rec.extra.get("join_token"):
                return str(rec.extra["join_token"])
        if proc.poll() is not None:
            raise RuntimeError(f"server pid {proc.pid} exited with code {proc.returncode}")
        time.sleep(0.2)
    raise TimeoutError("a server did not start in time")


def run(args: argparse.Namespace) -> int:
    from drift.models.checkpoint import open_checkpoint
    from drift.models.devices import parse_dtype, pick_device

    if args.num_servers < 1 or args.max_new_tokens < 1 or args.timeout <= 0:
        raise UsageError("need --num_servers >= 1, --max_new_tokens >= 1 and --timeout > 0")
    cache = resolve_cache_dir(args.cache_dir)
    env = dict(os.environ, DRIFT_CACHE=str(cache))
    print(f"opening {args.model} (converted once, then cached under {cache}) ...", flush=True)
    try:  # converted to what the servers (drift up's default dtype) will run
        ckpt = open_checkpoint(args.model, cache_dir=cache,
                               dtype=parse_dtype("auto", pick_device("auto")))  # fmt: skip
    except DriftError as exc:
        print(f"drift demo: {exc.message}", file=sys.stderr)
        return 1
    num_blocks = int(ckpt.config.get_text_config().num_hidden_layers)
    if args.num_servers > num_blocks:
        raise UsageError(f"--num_servers {args.num_servers}: {args.model} has {num_blocks} blocks")
    spans = overlapping_spans(num_blocks, args.num_servers)
    work = Path(tempfile.mkdtemp(prefix="drift-demo-"))
    deadline = time.monotonic() + args.timeout
    procs: list[subprocess.Popen[bytes]] = []
    rc = 1
    try:
        token = None
        for i, (start, end) in enumerate(spans):
            # loopback only: plain HTTP, so the printed dashboard opens without a warning
            cmd = ["up", args.model, "--host", "127.0.0.1", "--port", "0", "--plain_http",
                   "--block_indices", f"{start}:{end}", "--identity_path", str(work / f"{i}.key"),
                   "--cache_dir", str(cache), "--quant_type", args.quant_type]  # fmt: skip
            if token:
                cmd += ["--join", token]
            print(f"starting server {i + 1}/{len(spans)} on blocks [{start}, {end}) "
                  f"(log: {work / f'server-{i}.log'}) ...", flush=True)  # fmt: skip
            # Ctrl+C while the server starts (exec) would orphan it: held until it is in `procs`
            # (the server's `drift` unblocks them first thing: drift.cli.main)
            with signals_held():
                procs.append(_start(cmd, env, work, i))
            token = token or _wait_token(procs[0], cache, deadline)
        for p in procs[1:]:
            _wait_token(p, cache, deadline)
        rc = _generate(args, token, cache, deadline)
        return rc
    except (RuntimeError, TimeoutError, DriftError) as exc:
        print(f"drift demo: {exc}; server logs in {work}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"the swarm keeps running (join: drift up {args.model} --join {token}); "
                  "stop it with: drift down", flush=True)  # fmt: skip
        else:
            _stop(procs)
            _clean(work, keep_logs=rc != 0)


def _generate(args: argparse.Namespace, token: str | None, cache: Path, deadline: float) -> int:
    from drift.cli.generate import generate, load_client
    from drift.identity.tokens import parse_join_tokens
    from drift.swarm.reader import read_swarm_blocking

    assert token is not None
    tokens = parse_join_tokens(token)
    while True:  # wait until gossip has spread every server's record
        covs = read_swarm_blocking(tokens).coverages()
        if covs and not covs[0].missing:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the servers did not cover every block in time")
        time.sleep(0.5)
    print(f"swarm ready; dashboard: {tokens[0].url}/", flush=True)
    model, tokenizer = load_client(args.model, tokens, swarm_key=None, cache_dir=str(cache),
                                   torch_dtype="float32")  # fmt: skip
    print(f"\n>>> {args.prompt}\n", flush=True)
    try:
        result = generate(model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens)
    finally:
        model.close()
    print()
    for peer, addr, start, end in result.route:
        print(f"blocks [{start:>2}, {end:>2}) ran on {peer[:12]}..{peer[-6:]} at {addr}")
    print(
        f"{result.new_tokens} tokens in {result.seconds:.1f}s: {result.tokens_per_s:.1f} tokens/s"
    )
    if args.keep:  # otherwise the servers stop now: no URL that would not open
        print(f"dashboard: {tokens[0].url}/")
    return 0


def _clean(work: Path, *, keep_logs: bool) -> None:
    """Remove the servers' identity keys; the whole work dir too unless its logs are needed."""
    for key in work.glob("*.key*"):
        key.unlink(missing_ok=True)
    if keep_logs:
        return
    shutil.rmtree(work, ignore_errors=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if procs:
        print(f"stopped {len(procs)} servers", flush=True)
