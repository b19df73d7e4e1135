"""The swarm key, resolved once: the one precedence every command and the SDK follow.

`resolve_swarm_key(key, key_file=..., tokens=...)`: the key given (the CLI's --swarm_key, a
from_pretrained(swarm_key=...) or a ClientConfig's), else the first line of the key file
(--swarm_key_file), else the first join token's ?key=, else None (an open swarm). The CLI's
environment variables and config file fill `key`/`key_file` before this (drift.cli._settings:
command line, else $DRIFT_SWARM_KEY(_FILE), else the config file). Layers below take the
resolved key (ClientConfig.swarm_key, NodeConfig.swarm_key) and never choose again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from drift.identity.tokens import JoinToken
from drift.wire.errors import BadRequest

log = logging.getLogger("drift.secrets")


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The key in a file (its first line, stripped); BadRequest naming the file otherwise."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadRequest(f"cannot read key file {path}: {exc.strerror}") from exc
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise BadRequest(f"key file {path} is empty")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        log.warning("key file %s is readable by other users: chmod 600 %s", path, path)
    return key


def resolve_swarm_key(key: str | None = None, *, key_file: str | os.PathLike[str] | None = None,
                      tokens: Sequence[JoinToken] = ()) -> str | None:  # fmt: skip
    """The swarm key: `key`, else `key_file`'s first line, else a token's ?key=, else None."""
    if key:
        return key
    if key_file:
        return read_key_file(key_file)
    return next((t.swarm_key for t in tokens if t.swarm_key), None)
