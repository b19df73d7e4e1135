"""Gossip benchmark: N in-process membership nodes on 127.0.0.1, one event loop.

Each node joins through a random earlier node; prints the time until every node sees
every other one, and the bytes (request + reply bodies) moved per gossip exchange and per
round of the whole swarm. Bounded by --timeout; loopback only.

    .venv/bin/python scripts/bench_gossip.py --nodes 50 --interval 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import time
from collections import Counter

from drift.identity import Identity
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, start_app


async def bench(n: int, interval: float, fanout: int, timeout: float) -> int:
    base = NodeConfig(
        host="127.0.0.1",
        gossip_interval_s=interval,
        fanout=fanout,
        record_ttl_s=max(10.0, 10 * interval),
        request_timeout_s=5.0,
        leave_timeout_s=1.0,
    )
    nodes: list[MembershipNode] = []
    running: list[RunningApp] = []
    try:
        t_start = time.monotonic()
        for _ in range(n):
            seeds = (random.choice(nodes).join_token(),) if nodes else ()
            cfg = dataclasses.replace(base, initial_peers=seeds)
            node = MembershipNode(Identity.generate(), cfg)
            running.append(await start_app(build_node_app(node), "127.0.0.1", 0))
            nodes.append(node)
        t_started = time.monotonic()
        everyone = {node.peer_id for node in nodes}
        while True:
            seen = [len({r.peer_id for r in node.live_records()} & everyone) for node in nodes]
            if min(seen) == n:
                break
            if time.monotonic() - t_start > timeout:
                print(
                    f"NOT converged after {timeout:.0f} s: views range {min(seen)}..{max(seen)} of {n}"
                )
                return 1
            await asyncio.sleep(0.05)
        t_done = time.monotonic()
        rounds0 = sum(node.rounds for node in nodes)
        bytes0 = sum(node.bytes_moved for node in nodes)
        await asyncio.sleep(3 * interval)  # steady state
        rounds = sum(node.rounds for node in nodes) - rounds0
        moved = sum(node.bytes_moved for node in nodes) - bytes0
        rejected: Counter[str] = Counter()
        for node in nodes:
            rejected.update(node.table.rejected)
        print(f"nodes: {n}, gossip interval: {interval} s, fanout: {fanout}")
        print(f"started all nodes in {t_started - t_start:.2f} s")
        print(
            f"converged (every node sees all {n}) {t_done - t_start:.2f} s after the first "
            f"start, {t_done - t_started:.2f} s after the last"
        )
        if rounds:
            print(
                f"steady state: {moved / rounds / 1024:.1f} KiB per node-round "
                f"({moved / rounds / fanout / 1024:.1f} KiB per exchange), "
                f"{moved / rounds * n / 1024:.0f} KiB per swarm round"
            )
        print(f"records not taken, by reason: {dict(rejected)}")
        return 0
    finally:
        for r in reversed(running):
            await r.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--interval", type=float, default=1.0, help="gossip interval, seconds")
    p.add_argument("--fanout", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0, help="give up after, seconds")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(bench(args.nodes, args.interval, args.fanout, args.timeout))


if __name__ == "__main__":
    raise SystemExit(main())
