"""docker-compose.yml and Dockerfile: the files are valid and every command parses.

`docker compose config` runs where the docker client and its compose plugin work. Each
service's command is parsed with the real CLI parser (drift.cli.main.build_parser) without
running it (an unknown subcommand or flag fails the test). The
join wrapper (shell entrypoint) is run with stand-in `python` and `drift` programs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from drift.cli.main import build_parser, parse_args

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
FAKE_PEER = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


SEED_TOKEN = f"drift://{FAKE_PEER}@172.28.0.10:31337"


def full_argv(service: dict) -> list[str]:
    """The arguments `drift` receives in this service."""
    return list(service["command"])


def service_env(service: dict) -> dict[str, str]:
    """The DRIFT_* environment `drift` sees in this service (the join wrapper adds the seed;
    compose fills ${VAR:-default} from its own environment, here: the default)."""
    env = {
        k: str(v).split(":-")[-1].rstrip("}") for k, v in (service.get("environment") or {}).items()
    }
    if service.get("entrypoint"):
        env["DRIFT_INITIAL_PEERS"] = SEED_TOKEN
    return env


def test_compose_shape() -> None:
    services = compose()["services"]
    assert set(services) == {"seed", "server1", "server2", "api"}
    assert services["seed"]["command"][0] in ("dht", "up")
    for name, svc in services.items():
        assert svc["networks"] == {
            "drift": {"ipv4_address": svc["networks"]["drift"]["ipv4_address"]}
        }
        test = " ".join(svc["healthcheck"]["test"])
        assert "/health" in test, f"{name}: health check must GET /health"
        assert svc["volumes"][0].endswith(":/data"), f"{name}: identity and cache live in /data"
        if name != "seed":
            assert svc["depends_on"]["seed"]["condition"] == "service_healthy"
    # the two servers cover the demo model's 30 blocks, without a gap
    spans = []
    for name in ("server1", "server2"):
        cmd = services[name]["command"]
        start, end = cmd[cmd.index("--block_indices") + 1].split(":")
        spans.append((int(start), int(end)))
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == 30
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    # every announced address is the one the compose network gives the container
    for svc in services.values():
        cmd = svc["command"]
        if "--public_ip" in cmd:
            assert cmd[cmd.index("--public_ip") + 1] == svc["networks"]["drift"]["ipv4_address"]


@pytest.mark.parametrize("service", ["seed", "server1", "server2", "api"])
def test_service_command_parses_with_real_cli(service: str) -> None:
    argv = full_argv(compose()["services"][service])
    assert argv[0] in subcommands(), f"{service}: no subcommand {argv[0]!r}"
    service_def = compose()["services"][service]
    # flags, then DRIFT_* env, settled as `drift` does (SystemExit = failure on a bad flag)
    args = parse_args(argv, env={"HOME": "/nonexistent", **service_env(service_def)})
    assert args.command == argv[0]
    assert callable(getattr(args, "func", None))
    if argv[0] in ("dht", "server", "up"):  # the node options resolve to a valid NodeConfig
        from drift.cli.dht import node_config_from_args

        config = node_config_from_args(args)
        assert (config.host, config.port) == ("0.0.0.0", 31337)
        assert (
            config.public_ip == compose()["services"][service]["networks"]["drift"]["ipv4_address"]
        )
        assert len(config.initial_peers) == (0 if service == "seed" else 1)
    if argv[0] == "api":  # the checks drift api makes before loading anything pass
        from drift.cli.api import _check

        assert _check(args) is None, _check(args)


def test_join_wrapper_sets_the_seed_token(tmp_path: Path) -> None:
    if shutil.which("sh") is None:
        pytest.skip("no /bin/sh")
    service = compose()["services"]["server1"]
    sh, dash_c, script, argv0 = service["entrypoint"]
    assert (sh, dash_c, argv0) == ("sh", "-c", "drift")
    script = script.replace("$$", "$")  # compose's escape for a literal $
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f"#!/bin/sh\necho {FAKE_PEER}\n")
    (fake / "drift").write_text(
        '#!/bin/sh\nfor a in "$@"; do echo "$a"; done\necho "PEERS=$DRIFT_INITIAL_PEERS"\n'
    )
    for prog in fake.iterdir():
        prog.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["sh", "-c", script, argv0, *service["command"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [*full_argv(service), f"PEERS={SEED_TOKEN}"]
    assert "DRIFT_INITIAL_PEERS" in script and "--initial_peers" not in script


def test_no_secrets_or_peers_in_commands() -> None:
    for name, svc in compose()["services"].items():
        for flag in ("--api_key", "--swarm_key", "--initial_peers", "--join"):
            assert flag not in svc["command"], f"{name}: {flag} belongs in the environment"
    assert "DRIFT_API_KEY" in compose()["services"]["api"]["environment"]


def test_docker_compose_config() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker client not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"docker compose plugin not available: {probe.stderr.strip()[:200]}")
    proc = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr


def test_dockerfile_essentials() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[1].startswith("FROM python:") and "-slim" in lines[1]
    assert "ARG TORCH_VARIANT=cpu" in lines
    assert 'ENTRYPOINT ["drift"]' in lines
    assert any(ln.startswith("USER ") and ln != "USER root" for ln in lines)
    assert 'VOLUME ["/data"]' in lines
    # the files the image copies exist (hatchling also needs README.md, added with the docs)
    for copied in ("drift", "web", "pyproject.toml"):
        assert (REPO / copied).exists(), copied


COMPOSE_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def compose_bytes(text: str | int) -> int:
    """A compose memory size ("2g", "1536m", 1073741824) in bytes."""
    s = str(text).strip().lower().removesuffix("b") or "0"
    unit = COMPOSE_UNITS.get(s[-1], 1)
    return int(float(s.rstrip("kmg")) * unit)


def test_block_servers_have_memory_limits() -> None:
    """Every service serving blocks runs under a memory limit (its cgroup, which `drift up`
    reads as its budget), large enough for the blocks it pins plus the process itself."""
    services = compose()["services"]
    serving = {n: s for n, s in services.items() if s.get("command", [None])[0] in ("server", "up")}
    assert serving
    for name, svc in serving.items():
        limit = svc.get("mem_limit") or svc.get("deploy", {}).get("resources", {}).get(
            "limits", {}
        ).get("memory")
        assert limit, f"{name} has no memory limit"
        assert compose_bytes(limit) >= 1 << 30, f"{name}: {limit} is too small for its blocks"
