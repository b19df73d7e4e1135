"""Talk to one block server's /inference WebSocket by hand: open a session, send a prompt's
hidden states, then one token at a time, and print what comes back.

    python scripts/example_inference_ws.py http://127.0.0.1:31337

It uses only the wire messages (drift.wire), not the client SDK: the raw protocol of
docs/internals.md. The inputs are random activations of the model's hidden size.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import orjson
import torch

from drift.wire import messages as m


async def main(url: str, steps: int) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/blocks") as r:
            blocks = await r.json()  # what this server holds
        fingerprint, hidden = blocks["model_fingerprint"], blocks["hidden_size"]
        start, end = blocks["start_block"], blocks["end_block"]
        async with http.ws_connect(f"{url}/inference") as ws:
            opening = m.OpenSession(fingerprint, start, end, max_length=32, batch_size=1,
                                    dtype="float32")  # fmt: skip
            await ws.send_str(orjson.dumps(opening.to_wire()).decode())
            print("server:", await ws.receive_str())  # {"type": "session_opened", ...}
            position, prompt_length = 0, 5
            for step_id in range(1 + steps):  # the prompt, then single tokens
                length = prompt_length if step_id == 0 else 1
                states = torch.randn(1, length, hidden)  # [B, T, H]
                await ws.send_bytes(m.encode(m.StepRequest(step_id, position, states)))
                reply = m.decode(m.StepResponse, await ws.receive_bytes())
                print(f"step {reply.step_id}: blocks [{start}, {end}) -> "
                      f"{tuple(reply.hidden_states.shape)}")  # fmt: skip
                position += length
            await ws.send_str(orjson.dumps(m.CloseSession().to_wire()).decode())
            print("server:", await ws.receive_str())  # {"type": "session_closed", ...}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a block server, e.g. http://127.0.0.1:31337")
    parser.add_argument("--steps", type=int, default=3, help="single-token steps after the prompt")
    args = parser.parse_args()
    asyncio.run(main(args.url.rstrip("/"), args.steps))
