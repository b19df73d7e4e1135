"""Terminal formatting of `drift status` (the live command is tested in test_swarm_commands)."""

from __future__ import annotations

from drift.cli.status import block_ranges, format_coverage, format_members


def test_block_ranges():
    assert block_ranges([]) == ""
    assert block_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert block_ranges([3]) == "3"


def test_format_coverage_groups_runs_and_names_missing_blocks():
    a, b = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAA", "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBB"
    blocks = [{"index": i, "peers": [a], "throughput": 2.0} for i in range(3)]
    blocks += [{"index": 3, "peers": [a, b], "throughput": 4.0}]
    blocks += [{"index": i, "peers": [], "throughput": 0.0} for i in (4, 5)]
    cov = {
        "model": "tiny",
        "model_fingerprint": "ab" * 32,
        "num_blocks": 6,
        "blocks": blocks,
        "missing": [4, 5],
    }
    lines = format_coverage(cov)
    assert lines[0].startswith("model tiny (6 blocks")
    assert [ln.split()[0:2] for ln in lines[2:5]] == [["[0,", "3)"], ["[3,", "4)"], ["[4,", "6)"]]
    assert "MISSING" in lines[4]
    assert lines[-1] == "missing blocks: 4-5 (2 of 6)"


def test_format_members_marks_expired():
    rec = {
        "peer_id": "12D3KooWX",
        "addrs": ["http://127.0.0.1:1"],
        "role": "server",
        "start_block": 0,
        "end_block": 2,
        "state": "online",
        "throughput": 1.5,
        "cache_tokens_left": 10,
        "cache_tokens_total": 20,
        "active_sessions": 0,
        "expires_at": 100.0,
    }
    header, row = format_members([rec], now=200.0)
    assert "peer" in header and "[0, 2)" in row and "online (expired)" in row and "10/20" in row


def test_format_members_shows_dtype_and_quantization():
    base = {"peer_id": "12D3KooWX", "role": "server", "start_block": 0, "end_block": 2,
            "state": "online", "expires_at": 300.0}  # fmt: skip
    recs = [
        {**base, "peer_id": "12D3KooWA", "dtype": "bfloat16", "quant": "nf4"},
        {**base, "peer_id": "12D3KooWB", "dtype": "float32", "quant": "none"},
        {**base, "peer_id": "12D3KooWC", "role": "dht", "start_block": None, "end_block": None,
         "dtype": None, "quant": None},
    ]  # fmt: skip
    header, *rows = format_members(recs, now=200.0)
    assert "weights" in header.split()
    by_peer = {row.split()[0]: row for row in rows}
    assert "bfloat16 nf4" in by_peer["12D3KooWA"]
    assert " float32 " in by_peer["12D3KooWB"] and "none" not in by_peer["12D3KooWB"]
    assert by_peer["12D3KooWC"].split()[3:6] == ["-", "online", "-"]  # blocks, state, weights
