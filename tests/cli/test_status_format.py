"""Terminal formatting of `drift status` (the live command is tested in test_swarm_commands)."""

from __future__ import annotations

from drift.cli.status import format_coverage, format_members
from drift.swarm import BlockCoverage, Coverage
from drift.swarm import format_ranges as block_ranges
from tests.swarm.swarm_helpers import make_record


def test_block_ranges():
    assert block_ranges([]) == ""
    assert block_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert block_ranges([3]) == "3"


def test_format_coverage_groups_runs_and_names_missing_blocks():
    a, b = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAA", "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBB"
    blocks = [BlockCoverage(i, (a,), 2.0) for i in range(3)]
    blocks += [BlockCoverage(3, (a, b), 4.0)]
    blocks += [BlockCoverage(i, (), 0.0) for i in (4, 5)]
    cov = Coverage((), "tiny", "ab" * 32, 6, tuple(blocks), (4, 5))
    lines = format_coverage(cov)
    assert lines[0].startswith("model tiny (6 blocks")
    assert [ln.split()[0:2] for ln in lines[2:5]] == [["[0,", "3)"], ["[3,", "4)"], ["[4,", "6)"]]
    assert "MISSING" in lines[4]
    assert lines[-1] == "missing blocks: 4-5 (2 of 6)"


def test_format_members_marks_expired():
    rec = make_record(span=(0, 2), throughput=1.5, cache_tokens_left=10,
                      cache_tokens_total=20, expires_at=100.0)  # fmt: skip
    header, row = format_members([rec], now=200.0)
    assert "peer" in header and "[0, 2)" in row and "online (expired)" in row and "10/20" in row


def test_format_members_shows_dtype_and_quantization():
    nf4 = make_record(span=(0, 2), dtype="bfloat16", quant="nf4", expires_at=300.0)
    f32 = make_record(span=(0, 2), dtype="float32", quant="none", expires_at=300.0)
    dht = make_record(expires_at=300.0)  # role dht: no blocks, no dtype, no quantization
    header, *rows = format_members([nf4, f32, dht], now=200.0)
    assert "weights" in header.split()
    by_peer = {row.split()[0]: row for row in rows}
    short = {r.peer_id: f"{r.peer_id[:8]}..{r.peer_id[-6:]}" for r in (nf4, f32, dht)}
    assert "bfloat16 nf4" in by_peer[short[nf4.peer_id]]
    assert " float32 " in by_peer[short[f32.peer_id]] and "none" not in by_peer[short[f32.peer_id]]
    assert by_peer[short[dht.peer_id]].split()[3:6] == [
        "-",
        "online",
        "-",
    ]  # blocks, state, weights


def test_format_members_names_lora_adapters():
    rec = make_record(span=(0, 2), expires_at=300.0, adapters=["chat", "sql"])
    header, row = format_members([rec], now=200.0)
    assert " float32 +lora:chat,sql " in row


def test_format_members_shows_live_tokens_per_s():
    import dataclasses

    busy = dataclasses.replace(make_record(span=(0, 2), expires_at=300.0),
                               extra=(("tokens_per_s", 12.5),))  # fmt: skip
    quiet = make_record(span=(2, 4), expires_at=300.0)  # an older server: no load field
    header, *rows = format_members([busy, quiet], now=200.0)
    assert header.split()[-1] == "tokens/s"
    assert [row.split()[-1] for row in rows] == ["12.5", "-"]


def test_format_members_shows_draining_and_degraded_servers():
    import dataclasses

    base = make_record(span=(0, 2), expires_at=300.0)
    draining = dataclasses.replace(base, extra=(("draining", 1),))
    degraded = dataclasses.replace(make_record(span=(2, 4), expires_at=300.0),
                                   extra=(("degraded_s", 31.5),))  # fmt: skip
    healthy = dataclasses.replace(make_record(span=(0, 2), expires_at=300.0),
                                  extra=(("draining", 0), ("degraded_s", 0.0)))  # fmt: skip
    header, *rows = format_members([draining, degraded, healthy], now=200.0)
    states = {row.split()[0]: row.split()[5] for row in rows}  # "[0, 2)" is two words
    short = {r.peer_id: f"{r.peer_id[:8]}..{r.peer_id[-6:]}" for r in (draining, degraded, healthy)}
    assert states[short[draining.peer_id]] == "online,draining"
    assert states[short[degraded.peer_id]] == "online,degraded"
    assert states[short[healthy.peer_id]] == "online"
