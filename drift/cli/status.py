"""`drift status`: the swarm's members and block coverage as a terminal table.

Reads the verified membership table from the first initial peer that answers
(drift.swarm.reader, the SDK's reader) and computes coverage from it (drift.swarm.coverage,
what every node serves at /swarm/coverage). No torch. Knows nothing about serving.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

from drift.cli._exits import usage_errors
from drift.cli._options import add_initial_peers, add_swarm_key
from drift.identity.swarm_key import resolve_swarm_key
from drift.identity.tokens import parse_join_tokens
from drift.swarm import Coverage, PeerRecord, format_ranges, format_span
from drift.swarm.reader import read_swarm_blocking


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show the swarm's members and which blocks are covered",
        description="Print the swarm's membership table and block coverage, read from a peer.",
    )
    add_initial_peers(p, required=True)  # asked in order; the first that answers is used
    add_swarm_key(p)
    p.add_argument("--model", default=None, help="only this model (name or fingerprint)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="HTTP timeout in seconds (default: 10)"
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    p.set_defaults(func=run)


def format_members(records: Sequence[PeerRecord], *, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    rows = [("peer", "address", "role", "blocks", "state", "weights", "throughput", "cache left",
             "sessions", "tokens/s")]  # fmt: skip
    for rec in sorted(records, key=lambda r: (r.span is None, r.start_block or 0)):
        span = format_span(*rec.span) if rec.span is not None else "-"
        state = state_label(rec) + (" (expired)" if rec.expires_at < now else "")
        rows.append((_short(rec.peer_id), ", ".join(rec.addrs) or "-", rec.role, span, state,
                     weights_label(rec), f"{rec.throughput:.1f}",
                     f"{rec.cache_tokens_left}/{rec.cache_tokens_total}",
                     sessions_label(rec), load_label(rec)))  # fmt: skip
    return _table(rows)


def state_label(rec: PeerRecord) -> str:
    """'online', 'online,draining' (handing its sessions over, taking no new ones) or
    'online,degraded' (its compute stalled with work queued: routing avoids it while others
    serve its blocks)."""
    marks = ["draining"] * bool(rec.optional("draining")) + ["degraded"] * rec.degraded
    return ",".join([rec.state, *marks])


def sessions_label(rec: PeerRecord) -> str:
    """'2' (stepping), '2 +7 held' when some open sessions are idle (held prefixes)."""
    held = int(rec.optional("held_sessions") or 0)
    held = min(held, rec.active_sessions)
    active = rec.active_sessions - held
    return f"{active} +{held} held" if held else str(active)


def load_label(rec: PeerRecord) -> str:
    """The tokens/s a server announces (its live load), or '-' (dht nodes, older servers)."""
    tps = rec.optional("tokens_per_s")
    return "-" if tps is None else f"{tps:.1f}"


def weights_label(rec: PeerRecord) -> str:
    """'float32', 'bfloat16 nf4' (dtype and quantization of a server's weights), with
    '+lora:a,b' for the LoRA adapters it serves, or '-'."""
    if rec.dtype is None:
        return "-"
    label = f"{rec.dtype} {rec.quant}" if rec.quant not in (None, "none") else rec.dtype
    return label + (f" +lora:{','.join(rec.adapters)}" if rec.adapters else "")


def format_coverage(cov: Coverage) -> list[str]:
    n = cov.num_blocks or 0
    blocks = cov.blocks
    lines = [f"model {cov.model} ({n} blocks, fingerprint {str(cov.model_fingerprint)[:12]})"]
    rows = [("blocks", "servers", "throughput")]
    start = 0
    for i in range(1, len(blocks) + 1):  # group runs of blocks with the same servers
        if i == len(blocks) or blocks[i].peers != blocks[start].peers:
            names = ", ".join(_short(p) for p in blocks[start].peers) or "MISSING"
            span = format_span(blocks[start].index, blocks[i - 1].index + 1)
            rows.append((span, names, f"{blocks[start].throughput:.1f}"))
            start = i
    lines += _table(rows)
    if cov.missing:
        lines.append(f"missing blocks: {format_ranges(cov.missing)} ({len(cov.missing)} of {n})")
    else:
        lines.append(f"all {n} blocks covered")
    return lines


def _short(peer_id: str) -> str:
    return peer_id if len(peer_id) <= 16 else f"{peer_id[:8]}..{peer_id[-6:]}"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def run(args: argparse.Namespace) -> int:
    with usage_errors():
        tokens = parse_join_tokens(args.initial_peers)
        key = resolve_swarm_key(args.swarm_key, key_file=args.swarm_key_file, tokens=tokens)
    snap = read_swarm_blocking(tokens, swarm_key=key, timeout_s=args.timeout)
    coverages = snap.coverages(args.model)
    if args.json:
        print(json.dumps({"records": [r.to_wire() for r in snap.records],
                          "coverage": [c.to_wire() for c in coverages]}, indent=1))  # fmt: skip
        return 0
    online = [r for r in snap.records if r.state == "online"]
    print(f"swarm seen from {snap.url} ({snap.peer_id}): {len(online)} of "
          f"{len(snap.records)} peers online")  # fmt: skip
    print("\n".join(format_members(snap.records)))
    if not coverages:
        print("\nno model served yet")
    for cov in coverages:
        print()
        print("\n".join(format_coverage(cov)))
    return 0
