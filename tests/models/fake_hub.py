"""A small Hugging Face Hub on 127.0.0.1 for tests: the part of its HTTP API huggingface_hub uses.

Serves repos built in the test (`add_repo(repo_id, directory)`) at one commit each:
`/api/models/{repo}/revision/{rev}` (model info), `/api/models/{repo}/tree/{rev}` (file list),
`HEAD|GET /{repo}/resolve/{rev}/{file}` (metadata headers, bytes). Answers like the Hub for a
missing repo, revision or file and for a gated repo without the right token. Each client is
told apart by its token (`Authorization: Bearer ...`); `bytes_sent[token]` counts file bytes
served to it and `files_sent[token]` the files. Runs on its own thread and event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass
class Repo:
    commit: str  # 40 hex digits
    files: dict[str, bytes]  # path in the repo -> content
    gated_for: set[str] | None = None  # tokens allowed to read a gated repo (None: not gated)


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    bytes_sent: Counter[str] = field(default_factory=Counter)  # token -> file bytes served
    files_sent: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_repo(self, repo_id: str, directory: Path, *, gated_for: set[str] | None = None) -> str:
        """Serve every file under `directory` as `repo_id`; returns its commit hash."""
        files = {str(p.relative_to(directory)): p.read_bytes()
                 for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip
        digest = hashlib.sha1(repo_id.encode())
        for name, data in files.items():
            digest.update(name.encode() + hashlib.sha256(data).digest())
        self.repos[repo_id] = Repo(digest.hexdigest(), files, gated_for)
        return self.repos[repo_id].commit

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> FakeHub:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True, name="fake-hub").start()
        if not ready.wait(10):
            raise RuntimeError("the fake Hub did not start")
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self._tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    # --- the API ---------------------------------------------------------------------------
    def _repo(self, request: web.Request) -> tuple[str, Repo]:
        """The repo named in the URL at the asked revision, or the Hub's error answer."""
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            raise _error(404, "RepoNotFound", "Repository not found")
        token = _token(request)
        if repo.gated_for is not None and token not in repo.gated_for:
            raise _error(403, "GatedRepo", f"Access to model {repo_id} is restricted")
        if request.match_info["rev"] not in ("main", repo.commit):
            raise _error(404, "RevisionNotFound", "Invalid rev id")
        return repo_id, repo

    async def _info(self, request: web.Request) -> web.Response:
        repo_id, repo = self._repo(request)
        return web.json_response({
            "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
            "gated": False if repo.gated_for is None else "manual", "disabled": False,
            "siblings": [{"rfilename": name} for name in repo.files],
        })  # fmt: skip

    async def _tree(self, request: web.Request) -> web.Response:
        _, repo = self._repo(request)
        entries = []
        for name, data in repo.files.items():
            entry = {"type": "file", "path": name, "size": len(data), "oid": _git_oid(data)}
            if name.endswith(".safetensors"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}  # fmt: skip
            entries.append(entry)
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        _, repo = self._repo(request)
        path = request.match_info["path"]
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        data = repo.files.get(path)
        if data is None:
            raise _error(404, "EntryNotFound", f"{path} does not exist")
        etag = hashlib.sha256(data).hexdigest() if path.endswith(".safetensors") else _git_oid(data)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"',
                   "Content-Length": str(len(data)), "Accept-Ranges": "bytes"}  # fmt: skip
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        start = 0
        if request.http_range.start is not None:
            start = request.http_range.start
            headers["Content-Length"] = str(len(data) - start)
        token = _token(request)
        self.bytes_sent[token] += len(data) - start
        self.files_sent[token].append(path)
        return web.Response(body=data[start:], status=206 if start else 200, headers=headers)


def _token(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ").strip() or "anonymous"


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _error(status: int, code: str, message: str) -> web.HTTPException:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    cls = {403: web.HTTPForbidden, 404: web.HTTPNotFound}[status]
    return cls(headers=headers, text=f'{{"error": "{message}"}}', content_type="application/json")
