"""Downloading a model's client parts from the swarm, so a client needs no copy of the model.

`fetch_parts` asks the servers of one model, in turn, for the manifest of its client parts
(drift.wire.parts) and downloads each file not cached yet: streamed to `<sha256>.part`,
resumed with HTTP Range after an interruption, checked against its sha256, kept as a blob
named by it. When every file is there they become a checkpoint directory under
`<cache>/client-parts/<fingerprint>/`, which is accepted only if its config has that
fingerprint. A later open finds the directory and reads nothing from the network. Requests
carry the swarm key's HMAC; TLS is bound to the server's peer id. Knows nothing of models
beyond the fingerprint check.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from drift.swarm.dial import peer_ssl
from drift.swarm.reader import dial_failure, read_limited
from drift.wire.auth import auth_headers, check_reply
from drift.wire.errors import (
    DriftError,
    Forbidden,
    ModelMismatch,
    PeerUnavailable,
    Unauthorized,
    from_payload,
)
from drift.wire.parts import PartFile, PartsManifest, parts_path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: concurrent downloads are not serialised
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20
Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


@dataclass(frozen=True)
class Source:
    """A server to download from: its base URL and the peer id its TLS must prove."""

    url: str
    peer_id: str


@dataclass(frozen=True)
class FetchTimeouts:
    connect_s: float = 5.0  # opening a connection
    # the manifest: a server may still be preparing the parts (a Hub-backed one fetches its
    # embeddings' shard first, on the first request)
    manifest_s: float = 900.0
    read_s: float = 60.0  # the longest silence while a file's bytes stream in


@dataclass(frozen=True)
class Fetched:
    """Where the client parts are, and what getting them cost."""

    directory: Path
    manifest: PartsManifest
    bytes_downloaded: int  # 0 when everything came from the cache
    seconds: float
    source: str | None  # the server the bytes came from (None: the cache)


def parts_dir(cache_dir: Path, fingerprint: str) -> Path:
    return cache_dir / "client-parts" / fingerprint


def cached_parts(cache_dir: Path, fingerprint: str) -> PartsManifest | None:
    """The manifest of a complete download of `fingerprint`'s parts, or None."""
    directory = parts_dir(cache_dir, fingerprint)
    try:
        manifest = PartsManifest.from_wire(json.loads((directory / MANIFEST_FILE).read_text()))
    except (OSError, ValueError, DriftError):
        return None
    for f in manifest.files:
        path = directory / f.name
        if not path.is_file() or path.stat().st_size != f.size:
            return None
    return manifest if manifest.fingerprint == fingerprint else None


def _lock(directory: Path) -> Any:
    """Hold directory/.lock exclusively (blocks; POSIX flock, elsewhere nothing); the open
    file to close to release it."""
    directory.mkdir(parents=True, exist_ok=True)
    f = (directory / ".lock").open("a")
    if fcntl is not None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    return f


async def fetch_parts(
    http: aiohttp.ClientSession, sources: Sequence[Source], fingerprint: str, cache_dir: Path,
    *, swarm_key: str | None, verify: Callable[[Path, PartsManifest], object],
    timeouts: FetchTimeouts = FetchTimeouts(), progress: Progress | None = None,
) -> Fetched:  # fmt: skip
    """The client parts of `fingerprint`, from the cache or from the first of `sources` that
    serves them whole. `verify(directory, manifest)` raises when the assembled directory is
    not that model (drift.client.resolve checks the config's fingerprint)."""
    directory = parts_dir(cache_dir, fingerprint)
    started = time.perf_counter()
    lock = await asyncio.to_thread(_lock, directory)  # one downloader per model at a time
    try:
        cached = cached_parts(cache_dir, fingerprint)  # maybe another process just finished
        if cached is not None:
            return Fetched(directory, cached, 0, 0.0, None)
        return await _fetch_from(http, sources, fingerprint, directory, swarm_key, verify,
                                 timeouts, progress, started)  # fmt: skip
    finally:
        lock.close()  # closing drops the flock


async def _fetch_from(
    http: aiohttp.ClientSession, sources: Sequence[Source], fingerprint: str, directory: Path,
    swarm_key: str | None, verify: Callable[[Path, PartsManifest], object],
    timeouts: FetchTimeouts, progress: Progress | None, started: float,
) -> Fetched:  # fmt: skip
    errors: list[str] = []
    for source in sources:
        try:
            manifest = await _manifest(http, source, fingerprint, swarm_key, timeouts)
            moved = await _download_all(http, source, manifest, directory, swarm_key, timeouts,
                                        progress)  # fmt: skip
        except (Unauthorized, Forbidden):
            raise
        except DriftError as exc:
            errors.append(f"{source.peer_id[:16]}... at {source.url}: {exc.message}")
            continue
        _assemble(directory, manifest, verify)
        return Fetched(directory, manifest, moved, time.perf_counter() - started, source.url)
    if not sources:
        raise PeerUnavailable(f"no live server of model {fingerprint[:16]}... to download its "
                              "client parts from")  # fmt: skip
    raise PeerUnavailable("could not download the client parts from any server: "
                          + "; ".join(errors[:4]))  # fmt: skip


async def _manifest(http: aiohttp.ClientSession, source: Source, fingerprint: str,
                    swarm_key: str | None, timeouts: FetchTimeouts) -> PartsManifest:  # fmt: skip
    path = parts_path(fingerprint)
    sent = auth_headers(swarm_key, "GET", path, peer_id=source.peer_id)
    timeout = aiohttp.ClientTimeout(total=timeouts.manifest_s, connect=timeouts.connect_s)
    try:
        async with http.get(source.url + path, headers=sent, timeout=timeout,
                            ssl=peer_ssl(source.peer_id)) as resp:  # fmt: skip
            body = await read_limited(resp, MAX_MANIFEST_BYTES)
            status, headers = resp.status, resp.headers
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise PeerUnavailable(await dial_failure(exc, source.url, source.peer_id)) from exc
    data = _json_or_none(body)
    if status != 200:
        raise from_payload(data, status)
    check_reply(swarm_key, sent, status, headers, body, what=f"{source.url}{path}")
    manifest = PartsManifest.from_wire(data)
    if manifest.fingerprint != fingerprint:
        raise ModelMismatch(f"{source.url} answered the manifest of model "
                            f"{manifest.fingerprint[:16]}..., not {fingerprint[:16]}...")  # fmt: skip
    return manifest


def _json_or_none(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def _download_all(
    http: aiohttp.ClientSession, source: Source, manifest: PartsManifest, directory: Path,
    swarm_key: str | None, timeouts: FetchTimeouts, progress: Progress | None,
) -> int:  # fmt: skip
    """Every file of `manifest` into directory/.blobs (resuming .part files); bytes moved."""
    blobs = directory / ".blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    total, finished, moved = manifest.total_bytes, 0, 0
    for f in manifest.files:
        blob = blobs / f.sha256
        if not (blob.is_file() and blob.stat().st_size == f.size):

            def report(n: int, base: int = finished) -> None:
                if progress is not None:
                    progress(base + n, total)

            moved += await _download(http, source, manifest.fingerprint, f, blobs, swarm_key,
                                     timeouts, report)  # fmt: skip
        finished += f.size
        if progress is not None:
            progress(finished, total)
    return moved


async def _download(
    http: aiohttp.ClientSession, source: Source, fingerprint: str, f: PartFile, blobs: Path,
    swarm_key: str | None, timeouts: FetchTimeouts, report: Callable[[int], None],
) -> int:  # fmt: skip
    """One file into blobs/<sha256>: appended to its .part (Range), checked, renamed; the
    bytes received. `report(n)`: n bytes of this file are here."""
    part = blobs / f"{f.sha256}.part"
    have = part.stat().st_size if part.is_file() else 0
    if have > f.size:
        part.unlink()
        have = 0
    path = parts_path(fingerprint, f.sha256)
    headers = auth_headers(swarm_key, "GET", path, peer_id=source.peer_id)
    if have:
        headers["Range"] = f"bytes={have}-"
    timeout = aiohttp.ClientTimeout(total=None, connect=timeouts.connect_s,
                                    sock_read=timeouts.read_s)  # fmt: skip
    moved = 0
    start = have
    try:
        async with http.get(source.url + path, headers=headers, timeout=timeout,
                            ssl=peer_ssl(source.peer_id)) as resp:  # fmt: skip
            if resp.status == 416 and have == f.size:
                pass  # it was all here already
            elif resp.status not in (200, 206):
                raise from_payload(_json_or_none(await read_limited(resp, 1 << 16)), resp.status)
            else:
                if resp.status == 200:  # no Range honoured: from the start
                    start = 0
                with part.open("r+b" if start else "wb") as out:
                    out.seek(start)
                    out.truncate()
                    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                        if start + moved + len(chunk) > f.size:
                            raise PeerUnavailable(f"{source.url} sent more than the {f.size} "
                                                  f"bytes of {f.name}")  # fmt: skip
                        out.write(chunk)
                        moved += len(chunk)
                        report(start + moved)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise PeerUnavailable(
            f"downloading {f.name}: {await dial_failure(exc, source.url, source.peer_id)}"
        ) from exc
    _check_blob(part, f, source)
    os.replace(part, blobs / f.sha256)
    return moved


def _check_blob(part: Path, f: PartFile, source: Source) -> None:
    """The downloaded bytes are the file the manifest names, or the .part is dropped."""
    size = part.stat().st_size if part.is_file() else 0
    if size != f.size:
        raise PeerUnavailable(f"{source.url} ended {f.name} after {size} of {f.size} bytes "
                              "(the next try resumes there)")  # fmt: skip
    digest = hashlib.sha256()
    with part.open("rb") as src:
        while block := src.read(1 << 22):
            digest.update(block)
    if digest.hexdigest() != f.sha256:
        part.unlink()
        raise PeerUnavailable(f"{source.url} sent {f.name} with another sha256 than its "
                              "manifest names; dropped")  # fmt: skip


def _assemble(directory: Path, manifest: PartsManifest,
              verify: Callable[[Path, PartsManifest], object]) -> None:  # fmt: skip
    """Blobs -> named files; `verify` the result; the manifest last (it marks completion).
    A directory that fails verification is removed whole."""
    blobs = directory / ".blobs"
    placed: dict[str, Path] = {}  # sha256 -> the file that took its blob
    for f in manifest.files:
        if f.sha256 in placed:  # two names, one content
            shutil.copyfile(placed[f.sha256], directory / f.name)
        else:
            os.replace(blobs / f.sha256, directory / f.name)
            placed[f.sha256] = directory / f.name
    try:
        verify(directory, manifest)
    except BaseException:
        for f in manifest.files:
            (directory / f.name).unlink(missing_ok=True)
        raise
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest.to_wire(), indent=1))
    shutil.rmtree(blobs, ignore_errors=True)


def byte_progress(label: str) -> Progress | None:
    """A tqdm bar of bytes on a terminal (stderr); None elsewhere (logs keep one summary)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar: list[tqdm] = []

    def update(done: int, total: int) -> None:
        if not bar:
            bar.append(tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=label, file=sys.stderr, leave=True))  # fmt: skip
        bar[0].n = done
        bar[0].refresh()
        if done >= total:
            bar[0].close()

    return update
