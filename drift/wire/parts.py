"""The client parts of a model as the swarm serves them: a manifest of content-addressed files.

`GET /parts/<fingerprint>` answers a `PartsManifest`: the model's display name, fingerprint and
revision, and every file a client needs (config, tokenizer files, generation config, chat
template, the client's tensors as one safetensors file), each with its sha256 and size.
`GET /parts/<fingerprint>/<sha256>` answers one file's bytes (HTTP Range for resuming).
Parsed and checked once here; knows nothing of models, disks or sockets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from drift.wire.errors import BadRequest

PARTS_PATH = "/parts"
MANIFEST_VERSION = 1
WEIGHTS_FILE = "model.safetensors"  # the client's tensors, under the name checkpoints use
REQUIRED_FILES = ("config.json", WEIGHTS_FILE)
MAX_FILES = 64  # a manifest naming more files is refused
MAX_FILE_BYTES = 1 << 40  # a file announced larger than this (1 TiB) is refused
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # no path: one plain name
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def parts_path(fingerprint: str, sha256: str | None = None) -> str:
    """The route of a model's manifest, or of one of its files."""
    return f"{PARTS_PATH}/{fingerprint}" + (f"/{sha256}" if sha256 else "")


@dataclass(frozen=True)
class PartFile:
    """One file of the client parts, named as in a checkpoint directory."""

    name: str  # plain file name, e.g. tokenizer.json (never a path)
    sha256: str  # lowercase hex of its bytes
    size: int  # bytes

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class PartsManifest:
    """What a client downloads to hold a model's client side without any local copy."""

    model: str  # the display name servers announce
    fingerprint: str  # drift.models.checkpoint.config_fingerprint of config + revision
    revision: str | None  # the revision the fingerprint covers (Hub commit, GGUF sha256)
    files: tuple[PartFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_wire(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "model": self.model, "fingerprint": self.fingerprint,
                "revision": self.revision, "files": [f.to_wire() for f in self.files]}  # fmt: skip

    @classmethod
    def from_wire(cls, data: Any) -> PartsManifest:
        """A checked manifest; BadRequest naming what is wrong."""
        if not isinstance(data, dict):
            raise BadRequest("a parts manifest must be a JSON object")
        if data.get("version") != MANIFEST_VERSION:
            raise BadRequest(f"parts manifest version {data.get('version')!r} is not "
                             f"{MANIFEST_VERSION}")  # fmt: skip
        model, fingerprint = data.get("model"), data.get("fingerprint")
        revision = data.get("revision")
        if not isinstance(model, str) or not model:
            raise BadRequest("parts manifest: 'model' must be a non-empty string")
        if not isinstance(fingerprint, str) or not _HEX64.match(fingerprint):
            raise BadRequest("parts manifest: 'fingerprint' must be 64 lowercase hex digits")
        if revision is not None and not isinstance(revision, str):
            raise BadRequest("parts manifest: 'revision' must be a string or null")
        raw = data.get("files")
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_FILES:
            raise BadRequest(f"parts manifest: 'files' must list 1 to {MAX_FILES} files")
        files = tuple(_part_file(item) for item in raw)
        names = [f.name for f in files]
        if len(set(names)) != len(names):
            raise BadRequest("parts manifest: a file name appears twice")
        missing = [n for n in REQUIRED_FILES if n not in names]
        if missing:
            raise BadRequest(f"parts manifest: no {', '.join(missing)}")
        return cls(model, fingerprint, revision, files)


def _part_file(item: Any) -> PartFile:
    if not isinstance(item, dict) or set(item) != {"name", "sha256", "size"}:
        raise BadRequest("parts manifest: each file is an object with name, sha256 and size")
    name, sha, size = item["name"], item["sha256"], item["size"]
    if not isinstance(name, str) or not _FILE_NAME.match(name):
        raise BadRequest(f"parts manifest: {name!r} is not a plain file name")
    if not isinstance(sha, str) or not _HEX64.match(sha):
        raise BadRequest(f"parts manifest: the sha256 of {name} is not 64 lowercase hex digits")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise BadRequest(f"parts manifest: the size of {name} must be 0..{MAX_FILE_BYTES} bytes")
    return PartFile(name, sha, size)


def is_fingerprint(text: str) -> bool:
    """True for a full model fingerprint (64 lowercase hex digits)."""
    return bool(_HEX64.match(text))
