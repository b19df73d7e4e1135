"""For `scripts/bench_serving.py --swarm MODEL`: 2 `drift server` processes over the block
halves of MODEL on 127.0.0.1 (one compute thread each, scripts/bench_client.py ServerProcs)
and a `drift api` process in front of them with its default flags (an API key added), all
stopped on exit."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

KEY = "bench-serving"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def api_over_swarm(model: str, api_args: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of `drift api` (its defaults, then `api_args`) over a fresh
    2-server loopback swarm of `model`."""
    from bench_client import ServerProcs

    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model)
    n = ckpt.config.num_hidden_layers
    with tempfile.TemporaryDirectory() as tmp:
        procs = ServerProcs(
            str(ckpt.path), [(0, n // 2), (n // 2, n)], Path(tmp), threads="default"
        )
        api = None
        try:
            port = _free_port()
            log = Path(tmp) / "api.log"
            cmd = [sys.executable, "-m", "drift.cli", "api", str(ckpt.path), "--initial_peers",
                   procs.token, "--port", str(port), "--api_key", KEY,
                   "--served_model_name", model, *api_args]  # fmt: skip
            with open(log, "wb") as out:
                api = subprocess.Popen(cmd, stdout=out, stderr=out)
            deadline = time.monotonic() + 180
            while not re.search(r"OpenAI-compatible API", log.read_text(errors="replace")):
                if api.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"drift api did not start:\n{log.read_text()}")
                time.sleep(0.2)
            flags = " ".join(["(defaults)", *api_args])
            print(f"2 servers {procs.urls} (decode threads, one row/batches: "
                  f"{', '.join(procs.threads())}), drift api on 127.0.0.1:{port} {flags}",
                  file=sys.stderr, flush=True)  # fmt: skip
            yield f"http://127.0.0.1:{port}", KEY
        finally:
            if api is not None and api.poll() is None:
                api.terminate()
                try:
                    api.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    api.kill()
                    api.wait()
            procs.stop()
