"""Where the CLI's secrets come from, and keeping them out of sight.

A secret (the swarm key, API keys) comes from its flag (visible in the process list, so a
warning says so), its key file flag (`--swarm_key_file`, one line), their environment
variables (`DRIFT_SWARM_KEY`, `DRIFT_API_KEY`, `..._FILE`) or the config file -- settled
once by drift.cli._settings -- or, for the swarm key, the `?key=` of a join token (the one
precedence, and read_key_file: drift.identity.swarm_key).
`scrub_argv` hides secrets in a command line before it is stored anywhere; `new_swarm_key`/`write_key_file` make the key of a new private swarm (mode 0600).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from drift.identity.swarm_key import read_key_file

log = logging.getLogger("drift.secrets")

SECRET_ENV = {"DRIFT_SWARM_KEY": "swarm_key", "DRIFT_API_KEY": "api_key"}
SECRET_FLAGS = ("--swarm_key", "--api_key")  # flags whose value is a secret
HIDDEN = "***"
_TOKEN_KEY = re.compile(r"([?&]key=)[^&\s]*")


def api_keys_from(flags: Sequence[str], key_file: str | None) -> tuple[str, ...]:
    """Accepted API keys: every --api_key (or $DRIFT_API_KEY, comma-separated) and the lines
    of --api_key_file (or $DRIFT_API_KEY_FILE)."""
    keys = list(flags)
    if key_file:
        path = Path(key_file).expanduser()
        read_key_file(path)  # the same checks (exists, not empty, permissions)
        keys += [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return tuple(dict.fromkeys(keys))


def warn_secret_flags(argv: Sequence[str]) -> None:
    """Warn once per secret flag given on the command line (the process list shows it)."""
    for flag in SECRET_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            env = next(var for var, key in SECRET_ENV.items() if key == flag[2:])
            log.warning("%s shows the key in the process list: prefer %s_file or $%s",
                        flag, flag, env)  # fmt: skip


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the values of secret flags and tokens' ?key= replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_FLAGS:
            out.append(f"{name}={HIDDEN}" if eq else arg)
            hide_next = not eq
            continue
        out.append(_TOKEN_KEY.sub(rf"\g<1>{HIDDEN}", arg))
    return out


def new_swarm_key() -> str:
    """A fresh random swarm key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def write_key_file(path: Path, key: str) -> None:
    """Write `key` to a new file readable by its owner only (FileExistsError if present)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
