"""A TCP proxy that delays every byte by half the round-trip time in each direction.

    python -m tests.cluster.proxy --rtt_ms 20 LISTEN_HOST:PORT=TARGET_HOST:PORT ...

This kernel has no netem, so link latency is made here: each chunk read is written to the
other side `rtt/2` after it arrived, in order (bandwidth is left to tbf on the links). Prints
"proxy LISTEN -> TARGET" per route once listening, then runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import time


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk held until `delay` seconds after it was read."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while chunk := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, chunk))
        queue.put_nowait((time.monotonic() + delay, b""))

    task = asyncio.create_task(read())
    try:
        while True:
            due, chunk = await queue.get()
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        task.cancel()
        writer.close()


async def serve_route(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    # asyncio keeps only weak references to tasks, and on Python 3.11 start_server keeps none
    # to a connection's handler: one waiting on a quiet connection could be collected
    # mid-flight ("Task was destroyed but it is pending!"), leaving both ends hanging.
    live: set[asyncio.Task] = set()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            live.add(me)
        try:
            try:
                tr, tw = await asyncio.open_connection(*target)
            except OSError:
                w.close()
                return
            await asyncio.gather(pipe(r, tw, delay), pipe(tr, w, delay))
        finally:
            live.discard(me)  # type: ignore[arg-type]

    server = await asyncio.start_server(handle, *listen)
    print(f"proxy {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def main(routes: list[str], rtt_ms: float) -> None:
    pairs = [tuple(map(_addr, r.split("=", 1))) for r in routes]
    await asyncio.gather(*(serve_route(a, b, rtt_ms / 2000) for a, b in pairs))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt_ms", type=float, required=True)
    p.add_argument("routes", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = p.parse_args()
    asyncio.run(main(args.routes, args.rtt_ms))
