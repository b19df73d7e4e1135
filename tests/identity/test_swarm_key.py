"""The swarm key's one precedence (drift.identity.swarm_key): the key given, else the key
file's first line, else a join token's ?key=, else none; and the SDK's rule beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from drift.client.config import ClientConfig
from drift.client.loading import parse_peers, sdk_swarm_key
from drift.identity import Identity, JoinToken
from drift.identity.swarm_key import resolve_swarm_key
from drift.wire.errors import BadRequest

PID = Identity.generate().peer_id


def key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "swarm.key"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_precedence_key_then_file_then_token_then_none(tmp_path: Path) -> None:
    path = key_file(tmp_path, "from-file\nsecond line ignored\n")
    tokens = (JoinToken(PID, "127.0.0.1", 1), JoinToken(PID, "127.0.0.1", 2, "from-token"))
    assert resolve_swarm_key("given", key_file=path, tokens=tokens) == "given"
    assert resolve_swarm_key(None, key_file=path, tokens=tokens) == "from-file"
    assert resolve_swarm_key("", key_file=str(path), tokens=tokens) == "from-file"
    assert resolve_swarm_key(None, tokens=tokens) == "from-token"
    assert resolve_swarm_key(None, tokens=tokens[:1]) is None
    assert resolve_swarm_key() is None


def test_bad_key_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="is empty"):
        resolve_swarm_key(key_file=key_file(tmp_path, "\n  \n"))
    with pytest.raises(BadRequest, match="cannot read key file .*missing"):
        resolve_swarm_key(key_file=tmp_path / "missing")


def test_sdk_takes_the_argument_or_the_config_and_refuses_both_differing() -> None:
    tokens = parse_peers(f"drift://{PID}@127.0.0.1:1?key=from-token")
    assert tokens[0].swarm_key == "from-token"  # parsed as given, not rewritten
    assert sdk_swarm_key("arg", None, tokens) == "arg"
    assert sdk_swarm_key(None, ClientConfig(swarm_key="cfg"), tokens) == "cfg"
    assert sdk_swarm_key("same", ClientConfig(swarm_key="same"), tokens) == "same"
    assert sdk_swarm_key(None, ClientConfig(), tokens) == "from-token"
    with pytest.raises(ValueError, match="disagree"):
        sdk_swarm_key("arg", ClientConfig(swarm_key="cfg"), tokens)
