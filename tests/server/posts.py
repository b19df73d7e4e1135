"""POST a typed message to a block server as a tensor frame and decode its typed reply."""

from __future__ import annotations

from drift.wire import messages as m
from drift.wire.frames import MEDIA_TYPE, compress


async def post(http, url, message, reply_cls, *, zstd=False):
    body = m.encode(message)
    headers = {"Content-Type": MEDIA_TYPE}
    if zstd:
        body, headers["Content-Encoding"] = compress(body), "zstd"
    async with http.post(url, data=body, headers=headers) as resp:
        data = await resp.read()
        assert resp.status == 200, data[:300]
        return m.decode(reply_cls, data)
