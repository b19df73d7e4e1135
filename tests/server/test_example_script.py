"""scripts/example_inference_ws.py (docs/api.md's raw /inference example) runs against a server."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "example_inference_ws.py"


API_DOC = SCRIPT.parents[1] / "docs" / "api.md"


def test_readme_names_the_script_as_run_here() -> None:
    usage = f"python scripts/{SCRIPT.name} http://"
    assert usage in API_DOC.read_text(), (
        f"docs/api.md no longer shows `{usage}...`, the raw /inference example this test runs; "
        "change docs/api.md and tests/server/test_example_script.py together"
    )


async def test_raw_websocket_example_runs(servers, tiny_llama) -> None:
    server = await servers(tiny_llama, 1, 3)
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1]), "OMP_NUM_THREADS": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), server.url, "--steps", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    text = out.decode()
    assert proc.returncode == 0, text
    assert '"session_opened"' in text and '"session_closed"' in text
    assert "step 0: blocks [1, 3) -> (1, 5, 64)" in text
    assert "step 2: blocks [1, 3) -> (1, 1, 64)" in text
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/blocks") as r:
        blocks = await r.json()
    assert blocks["active_sessions"] == 0
    assert blocks["cache_tokens_left"] == blocks["cache_tokens_total"]
