"""Where an option's value comes from: flag > environment > config file > default
(drift.cli._settings, applied once by drift.cli.main.parse_args), and the global options."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from drift.cli._exits import UsageError
from drift.cli._options import log_level
from drift.cli.main import main, parse_args
from drift.identity import Identity

PEER = Identity.generate().peer_id
FLAG_T, ENV_T, FILE_T, SEC_T = (f"drift://{PEER}@127.0.0.{i}:31337" for i in (1, 2, 3, 4))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "drift.toml"
    path.write_text(text)
    return path


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No DRIFT_* from the test's own environment; no ~/.config file unless written."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path), **extra}


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    cfg = write(tmp_path, f'initial_peers = ["{FILE_T}"]\ncache_dir = "/from/file"\n'
                          f'timeout = 3.5\n[status]\njson = true\n')  # fmt: skip
    base = ["status", "--config", str(cfg)]
    env = env_for(tmp_path, DRIFT_INITIAL_PEERS=ENV_T)
    # default: --timeout 10, --json off
    assert parse_args(["status", "--initial_peers", FLAG_T], env_for(tmp_path)).timeout == 10.0
    # file over default (top level and the [status] section)
    args = parse_args(base, env_for(tmp_path))
    assert args.initial_peers == [FILE_T] and args.timeout == 3.5 and args.json is True
    # env over file
    assert parse_args(base, env).initial_peers == [ENV_T]
    # flag over env
    assert parse_args([*base, "--initial_peers", FLAG_T], env).initial_peers == [FLAG_T]
    assert parse_args([*base, "--timeout", "7"], env).timeout == 7.0


def test_command_section_beats_top_level_and_uses_flag_names(tmp_path: Path) -> None:
    cfg = write(tmp_path, f'port = 4000\n[up]\nport = 4001\njoin = "{SEC_T}"\nplain_http = true\n'
                          '[dht]\nannounce_maddrs = ["/ip4/10.0.0.1/tcp/1", "/ip4/10.0.0.2/tcp/2"]\n')  # fmt: skip
    up = parse_args(["up", "--config", str(cfg)], env_for(tmp_path))
    assert up.port == 4001 and up.initial_peers == [SEC_T] and up.tls is False
    dht = parse_args(["dht", "--config", str(cfg)], env_for(tmp_path))
    assert dht.port == 4000 and dht.announce_maddrs == [
        "/ip4/10.0.0.1/tcp/1",
        "/ip4/10.0.0.2/tcp/2",
    ]
    assert parse_args(["up", "--config", str(cfg), "--tls"], env_for(tmp_path)).tls is True


def test_default_config_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "drift").mkdir(parents=True)
    (tmp_path / "xdg" / "drift" / "drift.toml").write_text('log_level = "warning"\n')
    args = parse_args(["down"], env_for(tmp_path))
    assert log_level(args) == "WARNING"


def test_env_vars_for_secrets_and_addresses(tmp_path: Path) -> None:
    key_file = tmp_path / "swarm.key"
    env = env_for(tmp_path, DRIFT_SWARM_KEY="s3cret", DRIFT_API_KEY="k1, k2",
                  DRIFT_INITIAL_PEERS=f"{ENV_T},{FILE_T}", DRIFT_CACHE="/env/cache")  # fmt: skip
    api = parse_args(["api"], env)
    assert api.swarm_key == "s3cret" and api.api_key == ["k1", "k2"]
    assert api.initial_peers == [ENV_T, FILE_T] and api.cache_dir == "/env/cache"
    # --swarm_key_file and $DRIFT_SWARM_KEY are one setting: the flag wins as a whole
    server = parse_args(["server", "--swarm_key_file", str(key_file)], env)
    assert server.swarm_key is None and server.swarm_key_file == str(key_file)
    # a required --initial_peers is satisfied by the environment
    assert parse_args(["status"], env).initial_peers == [ENV_T, FILE_T]


def test_bad_env_or_file_values_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="DRIFT_LOG_LEVEL"):
        parse_args(["down"], env_for(tmp_path, DRIFT_LOG_LEVEL="loud"))
    cases = {
        "port = 'x'\n": "invalid value",
        "[up]\nno_such = 1\n": "no_such",
        "[nope]\nport = 1\n": "not a drift command",
        "typo_key = 1\n": "typo_key",
        "[up]\nquant_type = 'int3'\n": "invalid choice",
        "[up]\nprivate = 'maybe'\n": "true or false",
        "not toml [": "cannot read",
    }
    for text, needle in cases.items():
        cfg = write(tmp_path, text)
        with pytest.raises(UsageError, match=needle):
            parse_args(["up", "--config", str(cfg)], env_for(tmp_path))
    with pytest.raises(UsageError, match="does not exist"):
        parse_args(["down", "--config", str(tmp_path / "missing.toml")], env_for(tmp_path))
    cfg = write(tmp_path, "port = 'x'\n")
    assert main(["dht", "--config", str(cfg)]) == 2


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["--log_level", "debug", "down"], "DEBUG"),
        (["down", "--log_level", "Warning"], "WARNING"),
        (["down", "-v"], "DEBUG"),
        (["-q", "down"], "WARNING"),
        (["down", "-qq"], "ERROR"),
        (["down"], "INFO"),
        (["--log_level", "error", "down", "-v"], "ERROR"),  # the explicit level wins
    ],
)
def test_log_level_any_case_before_or_after_the_command(tmp_path: Path, argv: list[str],
                                                        level: str) -> None:  # fmt: skip
    assert log_level(parse_args(argv, env_for(tmp_path))) == level


def test_log_level_env_and_flags(tmp_path: Path) -> None:
    env = env_for(tmp_path, DRIFT_LOG_LEVEL="debug")
    assert log_level(parse_args(["down"], env)) == "DEBUG"
    assert log_level(parse_args(["down", "-q"], env)) == "WARNING"  # -q is a flag: beats env


def test_announce_maddrs_leaves_the_model_alone(tmp_path: Path) -> None:
    args = parse_args(["up", "--announce_maddrs", "/ip4/203.0.113.5/tcp/31337", "tinyllama"],
                      env_for(tmp_path))  # fmt: skip
    assert args.model == "tinyllama" and args.announce_maddrs == ["/ip4/203.0.113.5/tcp/31337"]
    args = parse_args(["server", "--announce_maddrs", "/ip4/1.2.3.4/tcp/1,/ip4/1.2.3.5/tcp/1",
                       "--announce_maddrs", "/ip4/1.2.3.6/tcp/1", "m"], env_for(tmp_path))  # fmt: skip
    assert args.model == "m" and len(args.announce_maddrs) == 3


def test_secret_flag_warns_env_does_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from drift.cli._secrets import warn_secret_flags

    with caplog.at_level(logging.WARNING):
        warn_secret_flags(["dht", "--swarm_key=abc"])
        warn_secret_flags(["dht", "--swarm_key_file", "f"])
    assert len(caplog.records) == 1 and "DRIFT_SWARM_KEY" in caplog.records[0].getMessage()
    assert "abc" not in caplog.text


def test_python_dash_m_drift(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "drift", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert out.returncode == 0 and "exit codes: 0 ok" in out.stdout


def test_drift_config_env_names_the_file(tmp_path: Path) -> None:
    cfg = write(tmp_path, "[down]\ntimeout = 5\n")
    assert parse_args(["down"], env_for(tmp_path, DRIFT_CONFIG=str(cfg))).timeout == 5.0
    with pytest.raises(UsageError, match="does not exist"):
        parse_args(["down"], env_for(tmp_path, DRIFT_CONFIG=str(tmp_path / "nope.toml")))
