"""A minimal headless-Chromium driver over the DevTools protocol (aiohttp WebSocket).

Starts /usr/bin/chromium with a throwaway profile, opens one page and offers navigate,
evaluate (JS expression -> JSON value), wait_for (poll an expression until truthy) and
screenshot. Knows nothing about DRIFT; used by the dashboard tests.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page; use `async with Browser.start() as page`."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.profile = Path(tempfile.mkdtemp(prefix="drift-chromium-"))
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.ids = itertools.count(1)
        self.console: list[str] = []

    @classmethod
    def start(cls) -> Browser:
        return cls()

    async def __aenter__(self) -> Browser:
        self.proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={self.profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        port = await asyncio.wait_for(self._devtools_port(), timeout=60)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Runtime.enable")
        await self.send("Page.enable")
        return self

    async def _devtools_port(self) -> int:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = (await self.proc.stderr.readline()).decode(errors="replace")
            if not line:
                raise BrowserError("chromium exited before opening DevTools")
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                return int(match.group(1))

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.ws is not None
        msg_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), timeout=30)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise BrowserError(f"devtools socket closed: {msg.type}")
            data = json.loads(msg.data)
            if data.get("method") == "Runtime.consoleAPICalled":
                args = data["params"]["args"]
                self.console.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in args)
                )
            elif data.get("method") == "Runtime.exceptionThrown":
                self.console.append(str(data["params"]["exceptionDetails"]))
            if data.get("id") == msg_id:
                if "error" in data:
                    raise BrowserError(f"{method}: {data['error']}")
                return data["result"]

    async def set_viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    async def set_color_scheme(self, scheme: str) -> None:
        """Emulate `prefers-color-scheme: light|dark` for the page."""
        await self.send(
            "Emulation.setEmulatedMedia",
            features=[{"name": "prefers-color-scheme", "value": scheme}],
        )

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        value = None
        while loop.time() < deadline:
            try:
                value = await self.evaluate(expression)
            except BrowserError:
                value = None  # page still loading
            if value:
                return value
            await asyncio.sleep(0.2)
        raise BrowserError(
            f"timed out after {timeout}s waiting for {expression!r} (last {value!r}); "
            f"console: {self.console[-5:]}"
        )

    async def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        result = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(result["data"]))
        return path
