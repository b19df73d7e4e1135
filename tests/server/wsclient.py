"""A bare WebSocket client for /inference, speaking the wire messages directly (tests only)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import torch

from drift.wire import messages as m


class RawSession:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.step_id = 0

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str, model: str, start: int, end: int,
                   *, max_length: int = 64, batch_size: int = 1, dtype: str = "float32") -> Any:  # fmt: skip
        """A RawSession, or the error message dict the server answered with."""
        ws = await http.ws_connect(f"{url}/inference")
        await ws.send_str(orjson.dumps(
            m.OpenSession(model, start, end, max_length, batch_size, dtype).to_wire()).decode())  # fmt: skip
        reply = orjson.loads((await ws.receive()).data)
        if reply["type"] != "session_opened":
            await ws.close()
            return reply
        return cls(ws)

    async def send_step(self, hidden: torch.Tensor, position: int, **extra: Any) -> int:
        self.step_id += 1
        await self.ws.send_bytes(m.encode(m.StepRequest(self.step_id, position, hidden, **extra)))
        return self.step_id

    async def step(self, hidden: torch.Tensor, position: int, **extra: Any) -> torch.Tensor:
        step_id = await self.send_step(hidden, position, **extra)
        msg = await self.ws.receive()
        assert msg.type == aiohttp.WSMsgType.BINARY, msg.data
        reply = m.decode(m.StepResponse, msg.data)
        assert reply.step_id == step_id
        return reply.hidden_states

    async def step_error(self, hidden: torch.Tensor, position: int, **extra: Any) -> dict:
        step_id = await self.send_step(hidden, position, **extra)
        msg = await self.ws.receive()
        assert msg.type == aiohttp.WSMsgType.TEXT, msg.type
        err = orjson.loads(msg.data)
        assert err["type"] == "error" and err["step_id"] == step_id
        return err

    async def close(self) -> None:
        await self.ws.close()
