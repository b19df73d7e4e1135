"""Serving a model's client parts, so that a client needs no copy of the model.

`prepare_parts` writes, once per checkpoint, a directory under the server's cache holding the
files a client reads (drift.models.client_files: config, tokenizer, generation config, chat
template, and the client's tensors as one safetensors file, written a tensor at a time) and
their manifest (drift.wire.parts). `add_parts_routes` serves it: `GET /parts/<fingerprint>`
the manifest, `GET /parts/<fingerprint>/<sha256>` a file (HTTP Range: resumable), behind the
node's swarm-key middleware like every other route. Preparation runs on an executor, started
when the app starts (on the first request instead where it would fetch shards from the Hub
that the server's own blocks do not need); knows nothing of blocks or sessions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from drift.models.checkpoint import Checkpoint
from drift.models.client_files import CLIENT_FILES, client_tensor_names
from drift.models.sources.local import INDEX_FILE, read_index
from drift.models.sources.stream_write import StreamingSafetensors, header_room
from drift.wire.errors import InternalError, NotFound
from drift.wire.parts import PARTS_PATH, WEIGHTS_FILE, PartFile, PartsManifest

log = logging.getLogger(__name__)
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class ClientParts:
    """A prepared parts directory: its manifest and where each file lies."""

    manifest: PartsManifest
    directory: Path

    def path_of(self, sha256: str) -> Path | None:
        for f in self.manifest.files:
            if f.sha256 == sha256:
                return self.directory / f.name
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _source_key(ckpt: Checkpoint) -> str:
    """A key that changes when the checkpoint's files do (path, names, sizes, mtimes)."""
    entries = [str(ckpt.path.resolve()), ckpt.fingerprint]
    for path in sorted(ckpt.path.iterdir()):
        if path.name in CLIENT_FILES or path.suffix == ".safetensors":
            stat = path.stat()
            entries.append(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _load(directory: Path) -> ClientParts | None:
    """The parts already prepared in `directory` (None when absent or incomplete)."""
    try:
        manifest = PartsManifest.from_wire(json.loads((directory / MANIFEST_FILE).read_text()))
    except (OSError, ValueError):
        return None
    for f in manifest.files:
        path = directory / f.name
        if not path.is_file() or path.stat().st_size != f.size:
            return None
    return ClientParts(manifest, directory)


def _write_weights(ckpt: Checkpoint, target: Path) -> int:
    """The client's tensors of `ckpt` into one safetensors file, as stored; returns #tensors."""
    names = client_tensor_names(ckpt)
    with StreamingSafetensors(target, header_room(names)) as out:
        for name in names:
            found = ckpt.tensors(name)  # reads this tensor (and any named name + suffix)
            out.add(name, found[""])
    return len(names)


def prepare_parts(ckpt: Checkpoint, cache_dir: Path) -> ClientParts:
    """The client parts of `ckpt` under `cache_dir`/parts, written once (blocking)."""
    key = _source_key(ckpt)
    directory = cache_dir / "parts" / f"{ckpt.fingerprint[:16]}-{key[:16]}"
    found = _load(directory)
    if found is not None:
        return found
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name in CLIENT_FILES:
            if (ckpt.path / name).is_file():
                shutil.copyfile(ckpt.path / name, tmp / name)  # follows a Hub cache's links
        count = _write_weights(ckpt, tmp / WEIGHTS_FILE)
        files = tuple(PartFile(p.name, _sha256(p), p.stat().st_size)
                      for p in sorted(tmp.iterdir()))  # fmt: skip
        manifest = PartsManifest(ckpt.name, ckpt.fingerprint, ckpt.revision, files)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest.to_wire(), indent=1))
        shutil.rmtree(directory, ignore_errors=True)  # an incomplete earlier try
        try:
            os.rename(tmp, directory)
        except OSError:
            if _load(directory) is None:  # not a concurrent preparation winning
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("client parts of %s: %d tensors and %d files, %.1f MiB, in %s", ckpt.name, count,
             len(files), manifest.total_bytes / 2**20, directory)  # fmt: skip
    return _load(directory) or ClientParts(manifest, directory)


class PartsService:
    """The client parts of the one model this node serves, prepared once in the background."""

    def __init__(self, ckpt: Checkpoint, cache_dir: Path) -> None:
        self.ckpt = ckpt
        self.cache_dir = cache_dir
        self._task: asyncio.Future[ClientParts] | None = None

    @property
    def fingerprint(self) -> str:
        return self.ckpt.fingerprint

    def start(self) -> asyncio.Future[ClientParts]:
        """Begin preparing (once) on the loop's default executor: file I/O, no torch math."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.run_in_executor(None, prepare_parts, self.ckpt, self.cache_dir)
        return self._task

    async def parts(self) -> ClientParts:
        try:
            return await asyncio.shield(self.start())
        except (OSError, ValueError) as exc:
            raise InternalError(f"cannot prepare the client parts of {self.ckpt.name}: "
                                f"{exc}") from exc  # fmt: skip


PARTS = web.AppKey("client_parts", PartsService)


def add_parts_routes(app: web.Application, service: PartsService) -> None:
    """Mount GET /parts/{fingerprint} and GET /parts/{fingerprint}/{sha256}."""
    app[PARTS] = service
    app.router.add_get(PARTS_PATH + "/{fingerprint}", _manifest)
    app.router.add_get(PARTS_PATH + "/{fingerprint}/{sha256}", _file)
    app.cleanup_ctx.append(_prepare_at_start)


async def _prepare_at_start(app: web.Application) -> AsyncIterator[None]:
    """Start preparing when the node starts, so the first client need not wait for it; but
    not when that would download shards a server does not need (a partial Hub checkpoint:
    then on the first request)."""
    service = app[PARTS]
    if client_shards_on_disk(service.ckpt):
        service.start().add_done_callback(_log_failure)
    yield


def client_shards_on_disk(ckpt: Checkpoint) -> bool:
    """True when every file holding a client tensor of `ckpt` is on disk already."""
    index = ckpt.path / INDEX_FILE
    if not index.is_file():
        return (ckpt.path / WEIGHTS_FILE).is_file()
    weight_map = read_index(index)
    shards = {weight_map[n] for n in client_tensor_names(ckpt) if n in weight_map}
    return all((ckpt.path / shard).is_file() for shard in shards)


def _log_failure(task: asyncio.Future[ClientParts]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("cannot prepare the client parts: %s", task.exception())


def _service(request: web.Request) -> PartsService:
    service = request.app[PARTS]
    fingerprint = request.match_info["fingerprint"]
    if fingerprint != service.fingerprint:
        raise NotFound(f"this node serves the client parts of {service.ckpt.name} "
                       f"({service.fingerprint}), not of model {fingerprint[:64]!r}")  # fmt: skip
    return service


async def _manifest(request: web.Request) -> web.Response:
    parts = await _service(request).parts()
    return web.json_response(parts.manifest.to_wire())


async def _file(request: web.Request) -> web.StreamResponse:
    parts = await _service(request).parts()
    sha256 = request.match_info["sha256"]
    path = parts.path_of(sha256)
    if path is None:
        raise NotFound(f"no client part with sha256 {sha256[:64]!r}")
    headers = {"Content-Type": "application/octet-stream",
               "Cache-Control": "public, max-age=31536000, immutable"}  # fmt: skip
    return web.FileResponse(path, headers=headers)
