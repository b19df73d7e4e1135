"""Handing a session over vs replaying it: time and bytes at several history lengths.

SmolLM2 (real weights), blocks [0, 15) loaded in this process (one compute thread). For
each history length a session is prefilled (the replay a replacement does without
handoff: timed), then handed over as the server does it: snapshot, each K/V piece encoded
as a frame, decoded and checked against the offer, assembled and installed into a fresh
session (timed; the bytes are the frames'). Loopback/link time is not in the handoff
figure: at L bytes/s add bytes / L. A decode step on both sessions must agree exactly.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_handoff.py --tokens 500 1500 4000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.span import ModelSpan  # noqa: E402
from drift.server.handoff import _snapshot  # noqa: E402
from drift.server.handoff_route import _empty, _install  # noqa: E402
from drift.server.sessions import Session  # noqa: E402
from drift.wire.frames import decode_frame, encode_frame  # noqa: E402
from drift.wire.handoff import HandoffPiece  # noqa: E402
from drift.wire.messages import OpenSession  # noqa: E402

START, END, CHUNK = 0, 15, 512


def session_of(span: ModelSpan, max_length: int) -> Session:
    req = OpenSession("fp", START, END, max_length, 1, "float32")
    cache = span.new_session(batch_size=1, max_length=max_length, start_block=START,
                             end_block=END)  # fmt: skip
    return Session("bench", req, None, cache, 0)


def hand_over(src: Session, dst: Session) -> int:
    """The server's handoff minus the socket; the bytes of the frames."""
    offer, pieces = _snapshot(src, "sender")
    keys, values, mask = _empty(offer)
    sent = 0
    for piece in pieces:
        frame = encode_frame(*piece.to_wire())
        sent += len(frame)
        got = HandoffPiece.from_wire(*decode_frame(frame), offer)
        t1 = got.t0 + got.keys.shape[2]
        keys[got.block][:, :, got.t0 : t1] = got.keys
        values[got.block][:, :, got.t0 : t1] = got.values
        mask = got.mask if got.mask is not None else mask
    assert mask is not None
    _install(dst, offer, keys, values, mask)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, nargs="+", default=[500, 1500, 4000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    span = ModelSpan.load(open_checkpoint(args.model), START, END, dtype=torch.float32)
    hidden = span.adapter.hidden_size
    print(f"blocks [{START}, {END}) of {args.model}, float32, 1 thread")
    print(f"{'history':>8} {'replay_s':>9} {'handoff_s':>10} {'MiB':>8} {'replay/handoff':>15}")
    for n in args.tokens:
        x = torch.randn(1, n, hidden, generator=torch.Generator().manual_seed(n))
        src = session_of(span, n + 4)
        started = time.perf_counter()
        for t0 in range(0, n, CHUNK):
            src.cache.step(x[:, t0 : t0 + CHUNK])
        replay = time.perf_counter() - started
        dst = session_of(span, n + 4)
        started = time.perf_counter()
        sent = hand_over(src, dst)
        handoff = time.perf_counter() - started
        nxt = torch.randn(1, 1, hidden)
        assert torch.equal(src.cache.step(nxt), dst.cache.step(nxt)), "handed-over state differs"
        print(f"{n:>8} {replay:>9.3f} {handoff:>10.4f} {sent / 2**20:>8.1f} "
              f"{replay / handoff:>14.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
