"""`drift api` as a real process (--local, tiny model) answering the curl examples of README.md and docs/api.md."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _wait_for_url(proc: subprocess.Popen, deadline_s: float) -> str:
    sel = selectors.DefaultSelector()
    assert proc.stderr is not None
    sel.register(proc.stderr, selectors.EVENT_READ)
    seen = ""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if sel.select(timeout=0.5):
            line = proc.stderr.readline()
            seen += line
            match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if match:
                return match.group(1)
    raise AssertionError(f"drift api did not start:\n{seen}")


def _curl(*args: str) -> str:
    out = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_cli_serves_the_readme_curl_examples(model_dir: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path.cwd()))
    cmd = [sys.executable, "-m", "drift.cli", "api", str(model_dir), "--local", "--port", "0",
           "--api_key", "sk-drift", "--served_model_name", "tiny",
           "--cors_origins", "http://app.example"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)  # fmt: skip
    try:
        url = _wait_for_url(proc, 90)
        auth = ["-H", "Authorization: Bearer sk-drift"]
        json_h = ["-H", "Content-Type: application/json"]
        models = json.loads(_curl(f"{url}/v1/models", *auth))
        assert [m["id"] for m in models["data"]] == ["tiny"]
        chat = json.loads(_curl(f"{url}/v1/chat/completions", *auth, *json_h, "-d",
            '{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], '
            '"max_tokens": 8, "temperature": 0}'))  # fmt: skip
        assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] >= 1
        stream = _curl("-N", f"{url}/v1/completions", *auth, *json_h, "-d",
            '{"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "stream": true, '
            '"temperature": 0}')  # fmt: skip
        events = [e for e in stream.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        assert all(json.loads(e[6:])["object"] == "text_completion" for e in events[:-1])
        denied = _curl("-w", "%{http_code}", f"{url}/v1/models", "-H", "Authorization: Bearer x")
        assert denied.endswith("401") and '"invalid_api_key"' in denied
        preflight = _curl("-i", "-X", "OPTIONS", f"{url}/v1/chat/completions",
                          "-H", "Origin: http://app.example",
                          "-H", "Access-Control-Request-Method: POST")  # fmt: skip
        assert preflight.startswith("HTTP/1.1 204")
        assert "Access-Control-Allow-Origin: http://app.example" in preflight
        assert "<title>DRIFT chat</title>" in _curl(f"{url}/")
        assert "drift_api_requests_total" in _curl(f"{url}/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
