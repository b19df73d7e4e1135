"""`drift status`: the swarm's members and block coverage as a terminal table.

Reads GET /swarm and GET /swarm/coverage from the first initial peer that answers, over
plain HTTP (urllib, no torch, no event loop). Knows nothing about serving or generating.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drift.cli._options import add_initial_peers, add_swarm_key
from drift.identity.tokens import JoinToken, parse_join_tokens
from drift.wire.errors import BadRequest, DriftError, PeerUnavailable, from_payload


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


def fetch_json(url: str, *, swarm_key: str | None = None, timeout: float = 10.0) -> Any:
    """GET `url` and decode its JSON; DRIFT errors are re-raised with their codes."""
    headers = {"Accept": "application/json"}
    if swarm_key:
        headers["Authorization"] = f"Bearer {swarm_key}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            payload = json.loads(exc.read())
        except ValueError:
            payload = None
        raise from_payload(payload, exc.code) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PeerUnavailable(f"cannot read {url}: {exc}") from exc


@dataclass(frozen=True)
class SwarmSnapshot:
    """What one peer says about the swarm: its table and per-model coverage."""

    token: JoinToken
    peer_id: str
    records: list[dict[str, Any]]
    coverages: list[dict[str, Any]]  # one /swarm/coverage answer per model


def read_swarm(
    tokens: tuple[JoinToken, ...],
    *,
    swarm_key: str | None = None,
    model: str | None = None,
    timeout: float = 10.0,
) -> SwarmSnapshot:
    """Ask each initial peer in turn; the first that answers gives the snapshot."""
    if not tokens:
        raise BadRequest("no initial peers given; pass --initial_peers drift://...")
    errors: list[str] = []
    for token in tokens:
        key = token.swarm_key or swarm_key
        try:
            swarm = fetch_json(f"{token.url}/swarm", swarm_key=key, timeout=timeout)
            if swarm.get("peer_id") != token.peer_id:
                raise PeerUnavailable(
                    f"{token.url} holds peer id {swarm.get('peer_id')}, not {token.peer_id}"
                )
            coverages = _coverages(token, key, model, timeout)
        except DriftError as exc:
            errors.append(f"{token.to_drift(with_key=False)}: {exc.message}")
            continue
        return SwarmSnapshot(token, token.peer_id, list(swarm.get("records", [])), coverages)
    raise PeerUnavailable("no initial peer answered: " + "; ".join(errors))


def _coverages(
    token: JoinToken, key: str | None, model: str | None, timeout: float
) -> list[dict[str, Any]]:
    def coverage_of(name: str | None) -> dict[str, Any]:
        query = "" if name is None else "?model=" + urllib.parse.quote(name, safe="")
        return fetch_json(f"{token.url}/swarm/coverage{query}", swarm_key=key, timeout=timeout)

    if model is not None:
        return [coverage_of(model)]
    first = coverage_of(None)
    models = first.get("models") or []
    if len(models) <= 1:
        return [first] if first.get("model") else []
    return [coverage_of(m.get("model_fingerprint") or m.get("model")) for m in models]


def block_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_members(records: list[dict[str, Any]], *, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    rows = [("peer", "address", "role", "blocks", "state", "weights", "throughput", "cache left",
             "sessions")]  # fmt: skip
    for rec in sorted(
        records, key=lambda r: (r.get("start_block") is None, r.get("start_block") or 0)
    ):
        span = (
            f"[{rec['start_block']}, {rec['end_block']})"
            if rec.get("start_block") is not None
            else "-"
        )
        state = str(rec.get("state"))
        if float(rec.get("expires_at") or now) < now:
            state += " (expired)"
        rows.append(
            (
                _short(str(rec.get("peer_id"))),
                ", ".join(rec.get("addrs") or []) or "-",
                str(rec.get("role", "-")),
                span,
                state,
                weights_label(rec),
                f"{float(rec.get('throughput') or 0):.1f}",
                f"{rec.get('cache_tokens_left', '-')}/{rec.get('cache_tokens_total', '-')}",
                str(rec.get("active_sessions", "-")),
            )
        )
    return _table(rows)


def weights_label(rec: dict[str, Any]) -> str:
    """'float32', 'bfloat16 nf4' (dtype and quantization of a server's weights), or '-'."""
    dtype, quant = rec.get("dtype"), rec.get("quant")
    if dtype is None:
        return "-"
    return f"{dtype} {quant}" if quant not in (None, "none") else str(dtype)


def format_coverage(cov: dict[str, Any]) -> list[str]:
    n = int(cov.get("num_blocks") or 0)
    blocks = cov.get("blocks") or []
    missing = cov.get("missing") or []
    lines = [
        f"model {cov.get('model')} ({n} blocks, fingerprint {str(cov.get('model_fingerprint'))[:12]})"
    ]
    rows = [("blocks", "servers", "throughput")]
    start = 0
    for i in range(1, len(blocks) + 1):  # group runs of blocks with the same servers
        if i == len(blocks) or blocks[i].get("peers") != blocks[start].get("peers"):
            peers = blocks[start].get("peers") or []
            names = ", ".join(_short(p) for p in peers) or "MISSING"
            span = f"[{blocks[start]['index']}, {blocks[i - 1]['index'] + 1})"
            rows.append((span, names, f"{float(blocks[start].get('throughput') or 0):.1f}"))
            start = i
    lines += _table(rows)
    if missing:
        lines.append(f"missing blocks: {block_ranges(missing)} ({len(missing)} of {n})")
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
    try:
        tokens = parse_join_tokens(args.initial_peers)
        snap = read_swarm(tokens, swarm_key=args.swarm_key, model=args.model, timeout=args.timeout)
    except DriftError as exc:
        print(f"drift status: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"records": snap.records, "coverage": snap.coverages}, indent=1))
        return 0
    online = [r for r in snap.records if r.get("state") == "online"]
    print(
        f"swarm seen from {snap.token.to_drift(with_key=False)}: "
        f"{len(online)} of {len(snap.records)} peers online"
    )
    print("\n".join(format_members(snap.records)))
    if not snap.coverages:
        print("\nno model served yet")
    for cov in snap.coverages:
        print()
        print("\n".join(format_coverage(cov)))
    return 0
