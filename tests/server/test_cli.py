"""`drift server` as a real process: it serves its blocks, answers /blocks, stops on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest

from drift.server.build import warn_dtype_mismatch, warn_revision_mismatch
from drift.swarm import parse_span as parse_block_indices
from drift.wire.errors import BadRequest


def test_block_indices_and_dtype_warning(caplog):
    assert parse_block_indices("3:7") == (3, 7)
    with pytest.raises(BadRequest, match="START:END"):
        parse_block_indices("3-7")
    peers = [SimpleNamespace(peer_id="12D3KooWa", dtype="bfloat16"),
             SimpleNamespace(peer_id="12D3KooWb", dtype="float32")]  # fmt: skip
    assert warn_dtype_mismatch(peers, "float32") == ["12D3KooWa"]
    assert "another dtype" in caplog.text


def test_revision_warning(caplog):
    peers = [SimpleNamespace(peer_id="12D3KooWa", model="m", model_fingerprint="f1"),
             SimpleNamespace(peer_id="12D3KooWb", model="m", model_fingerprint="f2"),
             SimpleNamespace(peer_id="12D3KooWc", model="other", model_fingerprint="f3")]  # fmt: skip
    assert warn_revision_mismatch(peers, "m", "f1") == ["12D3KooWb"]
    assert "another config or revision" in caplog.text
    assert warn_revision_mismatch(peers[:1], "m", "f1") == []


def test_drift_server_process(tiny_llama, tmp_path, popens):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "drift.cli.main", "server", str(tiny_llama), "--block_indices", "1:3",
         "--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--cache_dir", str(tmp_path),
         "--identity_path", str(tmp_path / "id.key")],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    popens.append(proc)
    port, lines = None, []
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        port = int(found.group(1)) if found else None
    assert port, "".join(lines)
    tls = ssl.create_default_context()  # TLS by default; the certificate proves a peer id,
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE  # not a host name
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/blocks", timeout=10,
                                context=tls) as resp:  # fmt: skip
        info = json.load(resp)
    assert (info["start_block"], info["end_block"]) == (1, 3)
    assert info["throughput"] > 0  # measured, then cached under --cache_dir
    assert "throughput.json" in os.listdir(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_adapters_flag_reaches_the_server_config(tmp_path):
    from drift.cli.main import build_parser
    from drift.cli.server import server_config_from_args

    for command in ("server", "up"):
        args = build_parser().parse_args([command, "--adapters", "chat=/a/chat", "/b/sql/"])
        config = server_config_from_args(args, cache_dir=tmp_path)
        assert config.adapters == (("chat", "/a/chat"), ("sql", "/b/sql/"))
    args = build_parser().parse_args(["server", "--adapters", "/a/x", "/b/x"])
    with pytest.raises(BadRequest, match="--adapters: adapter names must be distinct"):
        server_config_from_args(args, cache_dir=tmp_path)
