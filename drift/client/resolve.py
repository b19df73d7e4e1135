"""Which checkpoint a client runs, where it came from, and whether the swarm serves it.

`open_model` resolves what the user named, in this order: a Checkpoint as given; an existing
path or an installed demo alias (local files win); a Hub id through the Hub; otherwise (or
when the name is left out, is a fingerprint, or names an alias or Hub id this machine cannot
get) the model the swarm announces under that name, its client parts downloaded from the
servers (drift.client.parts) and cached by fingerprint. A model is its fingerprint: when the
swarm serves none of ours, `mismatch` names both sides (name, fingerprint, where each came
from) and how to fix it. The choice among served models is pure (`served_models`, `pick`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import torch

from drift.client.loop import LoopThread
from drift.client.parts import Fetched, Source, byte_progress, cached_parts, fetch_parts, parts_dir
from drift.identity.tokens import JoinToken
from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.sources.aliases import find_alias
from drift.paths import default_cache_dir
from drift.swarm.coverage import serving_records
from drift.swarm.reader import read_swarm
from drift.swarm.record import PeerRecord
from drift.wire.errors import BadRequest, DriftError, ModelMismatch, NotFound
from drift.wire.parts import PartsManifest, is_fingerprint

log = logging.getLogger(__name__)
_HEX = frozenset("0123456789abcdef")
MIN_FINGERPRINT_PREFIX = 8  # hex digits that name a model by the start of its fingerprint


@dataclass(frozen=True)
class ModelOrigin:
    """A client's model: its name, fingerprint, and where its files came from."""

    name: str
    fingerprint: str
    where: str  # e.g. "the local directory /data/m", "the swarm (client parts from ...)"
    given: str | None = None  # what the user named it by (a path, alias or Hub id), if local

    def describe(self) -> str:
        return f"{self.name!r} (fingerprint {self.fingerprint[:16]}..., from {self.where})"


@dataclass(frozen=True)
class ServedModel:
    """One model the swarm serves: its announced name, fingerprint and servers."""

    name: str
    fingerprint: str
    servers: tuple[PeerRecord, ...]

    def describe(self) -> str:
        first = self.servers[0]
        at = f" at {first.addrs[0]}" if first.addrs else ""
        return (f"{self.name!r} (fingerprint {self.fingerprint[:16]}..., announced by "
                f"{len(self.servers)} server(s), e.g. {first.peer_id[:16]}...{at})")  # fmt: skip


def served_models(records: Iterable[PeerRecord]) -> list[ServedModel]:
    """The models online servers announce, by fingerprint (sorted by name)."""
    groups: dict[str, list[PeerRecord]] = {}
    for r in serving_records(list(records)):
        assert r.model_fingerprint is not None
        groups.setdefault(r.model_fingerprint, []).append(r)
    models = [ServedModel(rs[0].model or fp[:16], fp, tuple(rs)) for fp, rs in groups.items()]
    return sorted(models, key=lambda m: (m.name, m.fingerprint))


def _listing(models: Sequence[ServedModel]) -> str:
    return "; ".join(m.describe() for m in models) or "no model yet"


def pick(models: Sequence[ServedModel], want: str | None,
         also: Sequence[str] = ()) -> ServedModel:  # fmt: skip
    """The served model named `want` (a display name, any case, or a fingerprint or its first
    8+ hex digits; `also`: other names for it, e.g. an alias's display name); the only one
    when `want` is None. BadRequest / NotFound saying what the swarm serves otherwise."""
    if not models:
        raise NotFound("the swarm serves no model yet: start a server (drift up MODEL --join "
                       "TOKEN) and try again")  # fmt: skip
    if want is None:
        if len(models) > 1:
            raise BadRequest(f"the swarm serves several models ({_listing(models)}); name one "
                             "(--model NAME, or from_pretrained(NAME, ...)) or give its "
                             "fingerprint")  # fmt: skip
        return models[0]
    folded = want.casefold()
    if len(folded) >= MIN_FINGERPRINT_PREFIX and set(folded) <= _HEX:
        by_fp = [m for m in models if m.fingerprint.startswith(folded)]
        if len(by_fp) == 1:
            return by_fp[0]
    names = {folded, *(n.casefold() for n in also)}
    by_name = [m for m in models if m.name.casefold() in names]
    if len(by_name) > 1:
        raise BadRequest(f"several checkpoints are announced as {want!r}: {_listing(by_name)}; "
                         "name one by its fingerprint")  # fmt: skip
    if not by_name:
        raise NotFound(f"the swarm serves no model named {want!r}; it serves {_listing(models)}")
    return by_name[0]


def mismatch(origin: ModelOrigin, models: Sequence[ServedModel]) -> ModelMismatch:
    """The error for a client whose model no server serves while others are served."""
    same = [m for m in models if m.name.casefold() == origin.name.casefold()]
    theirs = same or list(models)
    head = (f"no server serves your model {origin.describe()}: the swarm serves "
            f"{_listing(theirs)}")  # fmt: skip
    if same:
        head += " (the same name, another checkpoint: another config or revision)"
    target = theirs[0]
    fix = (f". To use the swarm's model, leave the model out (drift generate without --model; "
           f"from_pretrained(initial_peers=...)) or name it by its fingerprint "
           f"{target.fingerprint}: its client parts then come from the swarm. To use yours, "
           f"serve it (drift up {origin.given or origin.name} --join TOKEN)")  # fmt: skip
    return ModelMismatch(head + fix, model=origin.name, fingerprint=origin.fingerprint,
                         served=[m.fingerprint for m in theirs])  # fmt: skip


def check_served(origin: ModelOrigin, records: Iterable[PeerRecord]) -> None:
    """ModelMismatch when servers are online but none serves `origin`'s fingerprint."""
    models = served_models(records)
    if models and origin.fingerprint not in {m.fingerprint for m in models}:
        raise mismatch(origin, models)


def local_origin(text: str, ckpt: Checkpoint) -> ModelOrigin:
    """Where a checkpoint opened from `text` on this machine came from, in words."""
    alias = find_alias(text)
    if alias is not None:
        where = f"this machine's demo alias {text!r} (pip package {alias.package}, {ckpt.path})"
    elif Path(text).expanduser().exists():
        where = f"the local path {Path(text).expanduser().resolve()}"
    else:
        where = f"the Hugging Face Hub ({text}, revision {ckpt.revision})"
    return ModelOrigin(ckpt.name, ckpt.fingerprint, where, text)


def _is_hub_id(text: str) -> bool:
    return text.count("/") == 1 and not text.startswith(("/", ".", "~"))


@dataclass(frozen=True)
class Resolved:
    """A checkpoint a client opened, with where it came from and what getting it cost."""

    ckpt: Checkpoint
    origin: ModelOrigin
    fetched: Fetched | None = None  # set when the client parts came from the swarm


def open_model(
    name_or_path: Any, *, initial_peers: Sequence[JoinToken] = (), swarm_key: str | None = None,
    cache_dir: Any = None, revision: str | None = None, dtype: torch.dtype | None = None,
    token: str | bool | None = None, progress: bool = True,
) -> Resolved:  # fmt: skip
    """Open the model a client named (see the module docstring for the order); `swarm_key`:
    the resolved key (drift.identity.swarm_key.resolve_swarm_key), proved as given."""
    if isinstance(name_or_path, Resolved):
        return name_or_path
    if isinstance(name_or_path, Checkpoint):
        return Resolved(name_or_path, local_origin(str(name_or_path.path), name_or_path))
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    text = None if name_or_path is None else os.fspath(name_or_path)
    peers = tuple(initial_peers)
    if text is None and not peers:
        raise BadRequest("name a model (alias, directory, .gguf file or Hub id) or give "
                         "initial_peers to use the model the swarm serves")  # fmt: skip
    if text is not None and not is_fingerprint(text):
        local_error = _open_local(text, peers, cache, revision, dtype, token)
        if isinstance(local_error, Resolved):
            return local_error
    else:
        local_error = None
    if text is not None and is_fingerprint(text) and cached_parts(cache, text) is not None:
        return _from_cache(cache, text)
    try:
        return _from_swarm(text, peers, swarm_key, cache, progress)
    except NotFound as exc:
        if local_error is not None:  # neither here nor in the swarm: say both
            raise NotFound(f"{local_error.message}; and from the swarm: {exc.message}") from exc
        raise


def _open_local(text: str, peers: tuple[JoinToken, ...], cache: Path, revision: str | None,
                dtype: torch.dtype | None,
                token: str | bool | None) -> Resolved | DriftError | None:  # fmt: skip
    """The checkpoint from this machine or the Hub; without peers its error is raised, with
    peers it is returned (the swarm is tried next); None: not a local name at all."""
    path = Path(text).expanduser()
    local_name = path.exists() or find_alias(text) is not None or _is_hub_id(text)
    if not local_name and peers:
        return None
    try:
        ckpt = open_checkpoint(text, cache_dir=cache, revision=revision, blocks=range(0),
                               dtype=dtype, token=token)  # fmt: skip
    except DriftError as exc:
        if not peers or path.exists():
            raise
        log.info("%s is not available here (%s); asking the swarm", text, exc.message)
        return exc
    return Resolved(ckpt, local_origin(text, ckpt))


def _from_cache(cache: Path, fingerprint: str) -> Resolved:
    manifest = cached_parts(cache, fingerprint)
    assert manifest is not None
    ckpt = _parts_checkpoint(parts_dir(cache, fingerprint), manifest)
    where = f"the swarm (client parts cached in {ckpt.path})"
    return Resolved(ckpt, ModelOrigin(ckpt.name, ckpt.fingerprint, where))


def _parts_checkpoint(directory: Path, manifest: PartsManifest) -> Checkpoint:
    """The downloaded parts as a Checkpoint, refused unless its config has the fingerprint."""
    ckpt = Checkpoint(directory, name=manifest.model, revision=manifest.revision)
    if ckpt.fingerprint != manifest.fingerprint:
        raise ModelMismatch(f"the client parts of {manifest.model!r} have a config of "
                            f"fingerprint {ckpt.fingerprint[:16]}..., not the "
                            f"{manifest.fingerprint[:16]}... they were served as")  # fmt: skip
    return ckpt


def _from_swarm(want: str | None, peers: tuple[JoinToken, ...], swarm_key: str | None,
                cache: Path, progress: bool) -> Resolved:  # fmt: skip
    alias = find_alias(want) if want is not None else None
    also = (alias.name,) if alias is not None else ()
    loop = LoopThread()
    try:
        fetched = loop.run(_fetch(want, also, peers, swarm_key, cache, progress))
    finally:
        loop.close()
    ckpt = _parts_checkpoint(fetched.directory, fetched.manifest)
    where = (f"the swarm (client parts from {fetched.source})" if fetched.source
             else f"the swarm (client parts cached in {fetched.directory})")  # fmt: skip
    if fetched.bytes_downloaded:
        log.info("downloaded %.1f MiB of client parts of %s from %s in %.1f s",
                 fetched.bytes_downloaded / 2**20, ckpt.name, fetched.source,
                 fetched.seconds)  # fmt: skip
    return Resolved(ckpt, ModelOrigin(ckpt.name, ckpt.fingerprint, where), fetched)


async def _fetch(want: str | None, also: Sequence[str], peers: tuple[JoinToken, ...],
                 key: str | None, cache: Path, progress: bool) -> Fetched:  # fmt: skip
    async with aiohttp.ClientSession() as http:
        snap = await read_swarm(peers, swarm_key=key, http=http)
        chosen = pick(served_models(snap.live()), want, also)
        sources = [Source(r.addrs[0].rstrip("/"), r.peer_id) for r in chosen.servers if r.addrs]
        bar = byte_progress(f"client parts of {chosen.name}") if progress else None
        return await fetch_parts(http, sources, chosen.fingerprint, cache, swarm_key=key,
                                 verify=_parts_checkpoint, progress=bar)  # fmt: skip
