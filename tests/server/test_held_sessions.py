"""Held sessions: a server announces, of its open sessions, those no step used for a while
(a held prefix, an idle chat), so `drift status` and the dashboard show them apart from the
sessions that are stepping (a real server on loopback; the idle time is set, not waited)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import torch

from drift.cli.status import sessions_label
from drift.server.sessions import HELD_AFTER_S
from tests.server.harness import start_block_server
from tests.server.test_live_load import wait_until
from tests.server.wsclient import RawSession
from tests.swarm.swarm_helpers import make_record

ROOT = Path(__file__).resolve().parents[2]


def test_sessions_label() -> None:
    assert sessions_label(make_record(span=(0, 2), active_sessions=3)) == "3"
    assert (
        sessions_label(make_record(span=(0, 2), active_sessions=9, held_sessions=7)) == "2 +7 held"
    )
    assert (
        sessions_label(make_record(span=(0, 2), active_sessions=1, held_sessions=5)) == "0 +1 held"
    )


@pytest.mark.timeout(120)
async def test_idle_sessions_are_announced_as_held(tiny_llama: Path) -> None:
    a = await start_block_server(tiny_llama, 0, 2)
    try:
        hidden = a.server.backend.hidden_size
        async with aiohttp.ClientSession() as http:
            opened = []
            for _ in range(2):
                s = await RawSession.open(http, a.url, a.server.backend.model_name, 0, 2,
                                          max_length=8, batch_size=1)  # fmt: skip
                assert isinstance(s, RawSession), s
                await s.step(torch.randn(1, 1, hidden), 0)
                opened.append(s)
            registry = a.server.sessions
            assert registry.held() == 0  # both just stepped
            first = next(iter(registry.sessions.values()))
            first.last_used = time.monotonic() - HELD_AFTER_S - 1  # as if idle since

            async def announced() -> bool:
                rec = a.node.record
                return rec is not None and rec.optional("held_sessions") == 1.0

            await wait_until(announced, "the record to announce one held session")
            assert a.node.record.active_sessions == 2
            assert sessions_label(a.node.record) == "1 +1 held"
            for s in opened:
                await s.close()
    finally:
        await a.stop()


@pytest.mark.skipif(shutil.which("node") is None, reason="node (JavaScript) is not installed")
def test_dashboard_sessions_text() -> None:
    script = ("import {sessionsText} from './web/render.js';"
              "console.log(JSON.stringify([sessionsText({active_sessions: 9, held_sessions: 7}),"
              " sessionsText({active_sessions: 2}), sessionsText({active_sessions: 1,"
              " held_sessions: 4})]))")  # fmt: skip
    out = subprocess.run(["node", "--input-type=module", "-e", script], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["2 +7 held", "2", "0 +1 held"]
