"""Where a flag's value comes from when it is not on the command line: flag > env > file > default.

Environment variables (`ENV_VARS`) cover every secret and address; the optional TOML file
(`--config PATH`, else $DRIFT_CONFIG, else ~/.config/drift/drift.toml when it exists) uses
the flags' own names as keys, at the top level (for every command that has the flag) or in a
`[command]` section (that command only, winning over the top level):

    initial_peers = ["drift://12D3KooW...@192.168.1.20:31337"]
    swarm_key_file = "~/.config/drift/swarm.key"
    [up]
    quant_type = "nf4"
    plain_http = true

`apply_settings` turns what the environment and the file say into the parsers' defaults
before the one real parse, so argparse itself gives the command line the last word. Flags
that are two spellings of one setting (`SAME_SETTING`: --swarm_key / --swarm_key_file) are
taken together from the highest source that sets either. Pure argparse; starts nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drift.cli._exits import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_ENV = "DRIFT_CONFIG"
# Environment variable -> the flag (without --) it stands for, in every command that has it.
ENV_VARS: dict[str, str] = {
    "DRIFT_SWARM_KEY": "swarm_key",
    "DRIFT_SWARM_KEY_FILE": "swarm_key_file",
    "DRIFT_API_KEY": "api_key",  # comma-separated for several
    "DRIFT_API_KEY_FILE": "api_key_file",
    "DRIFT_INITIAL_PEERS": "initial_peers",  # comma-separated for several
    "DRIFT_CACHE": "cache_dir",
    "DRIFT_LOG_LEVEL": "log_level",
    "DRIFT_MAX_MEMORY": "max_memory",  # drift up: this process's share of the machine
}
# Flags (by dest) that set one thing together: a source that sets one of them sets the group.
SAME_SETTING: tuple[frozenset[str], ...] = (
    frozenset({"swarm_key", "swarm_key_file"}),
    frozenset({"api_key", "api_key_file"}),
    frozenset({"log_level", "verbose", "quiet"}),
)
NOT_SETTABLE = frozenset({"help", "version", "config", "command"})
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def default_config_path(env: Mapping[str, str]) -> Path:
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "drift" / "drift.toml"


def load_config(path: str | None, env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """(the TOML file's tables, its path) -- empty when no file was named and none exists."""
    chosen = Path(path).expanduser() if path else default_config_path(env)
    if not chosen.is_file():
        if path or env.get(CONFIG_ENV):
            raise UsageError(f"config file {chosen} does not exist")
        return {}, str(chosen)
    try:
        return tomllib.loads(chosen.read_text()), str(chosen)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read config file {chosen}: {exc}") from exc


def settable_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Key name -> action: each flag's long names without `--` (and dests of positionals)."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in NOT_SETTABLE or isinstance(action, argparse._SubParsersAction):
            continue
        names = [s[2:] for s in action.option_strings if s.startswith("--")]
        for name in names or [action.dest]:
            out[name] = action
    return out


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise UsageError(f"{where}: expected true or false, got {value!r}")


def _one(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, (dict, list)):
        raise UsageError(f"{where}: expected a single value, got {value!r}")
    try:
        out = action.type(value if isinstance(value, str) else str(value)) if action.type else value  # type: ignore[operator]
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise UsageError(f"{where}: invalid value {value!r} ({exc})") from exc
    if action.choices is not None and out not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise UsageError(f"{where}: invalid choice {value!r} (choose from {choices})")
    return out


def coerce(action: argparse.Action, value: Any, where: str, *, from_env: bool) -> Any:
    """`value` (a TOML value, or an environment string) as the parsed value of `action`."""
    if isinstance(action, (argparse._AppendAction, argparse._ExtendAction)):
        items = value if isinstance(value, list) else [value]
        if from_env:
            items = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
        out: list[Any] = []
        for item in items:
            one = _one(action, item, where)
            out.extend(one) if isinstance(action, argparse._ExtendAction) and isinstance(one, list) else out.append(one)  # fmt: skip
        return out
    if isinstance(action, argparse._StoreConstAction):  # store_true / store_false / const
        return action.const if _to_bool(value, where) else _negated(action)
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not str(value).isdigit():
            raise UsageError(f"{where}: expected a count (0, 1, 2, ...), got {value!r}")
        return int(value)
    return _one(action, value, where)


def _negated(action: argparse.Action) -> Any:
    if isinstance(action, argparse._StoreTrueAction):
        return False
    if isinstance(action, argparse._StoreFalseAction):
        return True
    return None


def _sources(parser: argparse.ArgumentParser, command: str | None, env: Mapping[str, str],
             config: Mapping[str, Any], config_path: str) -> list[dict[str, tuple[Any, str, bool]]]:  # fmt: skip
    """Per source, highest first: key -> (raw value, where it came from, is it from env)."""
    known = settable_actions(parser)
    env_src = {key: (env[var], f"${var}", True) for var, key in ENV_VARS.items()
               if env.get(var) and key in known}  # fmt: skip
    section = config.get(command, {}) if command else {}
    if not isinstance(section, dict):
        raise UsageError(f"{config_path}: [{command}] must be a table")
    sec_src = {k: (v, f"{config_path} [{command}] {k}", False) for k, v in section.items()}
    top = {k: v for k, v in config.items() if not isinstance(v, dict)}
    top_src = {k: (v, f"{config_path} {k}", False) for k, v in top.items() if k in known}
    for key in sec_src:
        if key not in known:
            raise UsageError(f"{config_path}: [{command}] has no option {key!r} (drift "
                             f"{command} --help lists them)")  # fmt: skip
    return [env_src, sec_src, top_src]


def apply_settings(parser: argparse.ArgumentParser, *, given: set[str], command: str | None,
                   env: Mapping[str, str], config: Mapping[str, Any],
                   config_path: str) -> None:  # fmt: skip
    """Set `parser`'s defaults from env and file for every setting not `given` on the line."""
    known = settable_actions(parser)
    sources = _sources(parser, command, env, config, config_path)
    done: set[str] = set(given)
    for action in known.values():
        dest = action.dest
        group = next((g for g in SAME_SETTING if dest in g), frozenset({dest}))
        if group & done:
            continue
        for source in sources:
            keys = [k for k in source if k in known and known[k].dest in group]
            if keys:
                for k in keys:
                    raw, where, from_env = source[k]
                    value = coerce(known[k], raw, where, from_env=from_env)
                    parser.set_defaults(**{known[k].dest: value})
                    known[k].required = False  # e.g. --initial_peers from the environment
                break
        done |= group
