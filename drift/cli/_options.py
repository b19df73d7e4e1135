"""The options several `drift` commands share, defined once: same name, default and help.

`add_node_options` is every swarm member's network/identity set (drift dht, server, up);
the `add_*` helpers below are the single definitions of --model, --initial_peers,
--swarm_key(_file), --cache_dir, --torch_dtype and --device. `listen_address` resolves
--host/--port/--host_maddrs. Pure argparse; nothing here starts anything.
"""

from __future__ import annotations

import argparse

DEFAULT_MODEL = "smollm2"
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 31337

MODEL_HELP = "alias (e.g. smollm2), local checkpoint dir, .gguf file or Hub id"
INITIAL_PEERS_HELP = (
    "join token (drift://<peer_id>@<host>:<port>) or multiaddr of a swarm member; several: "
    "comma-separated or the flag repeated (default: $DRIFT_INITIAL_PEERS)"
)
SWARM_KEY_HELP = (
    "secret of a private swarm; shows in the process list, so prefer --swarm_key_file or "
    "$DRIFT_SWARM_KEY (default: $DRIFT_SWARM_KEY, else the ?key= of a join token, else none)"
)
SWARM_KEY_FILE_HELP = (
    "file holding the swarm key (first line), e.g. a copy of drift up's swarm.key "
    "(default: $DRIFT_SWARM_KEY_FILE)"
)
CACHE_DIR_HELP = (
    "DRIFT's cache dir: converted models, throughput measurements, drift up's identity, "
    "process records for drift down (default: $DRIFT_CACHE or ~/.cache/drift)"
)
TORCH_DTYPE_HELP = (
    "auto | float32 | float16 | bfloat16 (default: auto = bfloat16 on an accelerator, "
    "float32 on CPU)"
)
DEVICE_HELP = "auto | cpu | cuda[:i] | xpu | mps (default: auto = the best available)"


def add_model(p: argparse.ArgumentParser, *, positional: bool = True,
              default: str | None = DEFAULT_MODEL, default_help: str | None = None) -> None:  # fmt: skip
    """MODEL (positional, optional) or --model, defaulting to the demo model (drift api: to
    the swarm's model, `default` None)."""
    name = "model" if positional else "--model"
    extra = {"nargs": "?"} if positional else {}
    shown = default_help or default
    p.add_argument(name, default=default, help=f"{MODEL_HELP} (default: {shown})",
                   **extra)  # type: ignore[arg-type]  # fmt: skip


def add_initial_peers(p: argparse.ArgumentParser, *, required: bool = False,
                      join_alias: bool = False) -> None:  # fmt: skip
    """--initial_peers (and, for drift up, its alias --join)."""
    names = ["--initial_peers", "--join"] if join_alias else ["--initial_peers"]
    # One value per flag (not nargs="+"), so a positional after it is not taken for a token:
    # `drift generate --initial_peers TOKEN "prompt"`, `drift up --join TOKEN MODEL`.
    p.add_argument(*names, dest="initial_peers", action="extend", type=split_tokens, default=[],
                   required=required, metavar="TOKEN", help=INITIAL_PEERS_HELP)  # fmt: skip


def split_tokens(text: str) -> list[str]:
    """One --initial_peers value: a token, or several separated by commas."""
    return [part.strip() for part in text.split(",") if part.strip()]


def add_swarm_key(p: argparse.ArgumentParser) -> None:
    """--swarm_key and --swarm_key_file (resolved by drift.identity.swarm_key.resolve_swarm_key)."""
    p.add_argument("--swarm_key", default=None, help=SWARM_KEY_HELP)
    p.add_argument("--swarm_key_file", default=None, help=SWARM_KEY_FILE_HELP)


def add_cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache_dir", default=None, help=CACHE_DIR_HELP)


def add_torch_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torch_dtype", default="auto", help=TORCH_DTYPE_HELP)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_node_options(p: argparse.ArgumentParser, *, join_alias: bool = False) -> None:
    """The options every swarm member takes (drift dht / server / up), identical in each:
    TLS bound to the node's identity unless --plain_http (`tls_enabled(args)`)."""
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"listen address (default: {DEFAULT_HOST}, all interfaces, so peers on other "
        "machines reach this node; 127.0.0.1 keeps a swarm on this machine)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"listen port (default: {DEFAULT_PORT}; 0 = any free port)")  # fmt: skip
    p.add_argument(
        "--host_maddrs",
        default=None,
        help="listen multiaddr instead of --host/--port, e.g. /ip4/0.0.0.0/tcp/31337 "
        "(overrides both)",
    )
    p.add_argument(
        "--announce_maddrs",
        action="extend",
        type=split_tokens,
        default=[],
        metavar="MADDR",
        help="multiaddr others reach this node at, e.g. /ip4/203.0.113.5/tcp/31337; several: "
        "comma-separated or the flag repeated (default: derived from the listen address)",
    )
    p.add_argument(
        "--public_ip",
        default=None,
        help="announce this IP with the listening port, e.g. behind NAT with a forwarded "
        "port (default: the --host address; the LAN address when listening on all interfaces)",
    )
    p.add_argument(
        "--identity_path",
        default=None,
        help="Ed25519 key file, created (mode 0600) on first start and reused so the peer id "
        "stays the same (default: <cache_dir>/identity.key for drift up; a new identity "
        "every start for drift dht and drift server)",
    )
    add_initial_peers(p, join_alias=join_alias)
    add_swarm_key(p)
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--plain_http", dest="tls", action="store_false", default=None,
                     help="serve plain HTTP instead of TLS, e.g. for curl; traffic is not "
                          "encrypted and join tokens end in ?tls=off (default: TLS with a "
                          "certificate bound to this node's identity, checked by every peer "
                          "and client against its peer id)")  # fmt: skip
    tls.add_argument("--tls", action="store_true", default=None,
                     help="serve TLS: the default, so this changes nothing (kept so that older "
                          "commands still work)")  # fmt: skip
    p.add_argument("--gossip_interval", type=float, default=5.0,
                   help="mean seconds between gossip rounds (default: 5)")  # fmt: skip
    p.add_argument("--record_ttl", type=float, default=30.0,
                   help="seconds after which a silent peer is dropped (default: 30)")  # fmt: skip
    p.add_argument("--fanout", type=int, default=3,
                   help="peers contacted per gossip round (default: 3)")  # fmt: skip
    add_cache_dir(p)


def tls_enabled(args: argparse.Namespace) -> bool:
    """TLS unless --plain_http (the default of every node command; --tls changes nothing)."""
    return args.tls is not False


def listen_address(args: argparse.Namespace) -> tuple[str, int]:
    """(host, port) from --host_maddrs when given, else from --host and --port."""
    if args.host_maddrs:
        from drift.identity.tokens import parse_listen_maddr

        return parse_listen_maddr(args.host_maddrs)
    return str(args.host), int(args.port)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
CONFIG_HELP = (
    "TOML file of option values, keys named as the flags, top-level or per [command] "
    "(default: $DRIFT_CONFIG, else ~/.config/drift/drift.toml when it exists)"
)


def log_level_name(text: str) -> str:
    """--log_level's type: any case ('debug', 'Debug', 'DEBUG')."""
    return text.strip().upper()


def add_global_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """--log_level, -v, -q and --config: on `drift` itself and on every command, so they may
    come before or after the command (`suppress`: a command's copy leaves what `drift` parsed
    alone unless given again)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--log_level", type=log_level_name, choices=LOG_LEVELS, default=default(None),
                   help="logging verbosity, any case (default: $DRIFT_LOG_LEVEL, else INFO; "
                        "-v = DEBUG, -q = WARNING, -qq = ERROR)")  # fmt: skip
    p.add_argument("-v", "--verbose", action="count", default=default(0),
                   help="more log output (DEBUG)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="count", default=default(0),
                   help="less log output: -q warnings and errors, -qq errors only")  # fmt: skip
    p.add_argument("--config", default=default(None), metavar="PATH", help=CONFIG_HELP)


def log_level(args: argparse.Namespace) -> str:
    """The level asked for: --log_level (or its env / file value), else from -v / -q, else INFO."""
    if getattr(args, "log_level", None):
        return str(args.log_level)
    step = max(
        -1, min(2, int(getattr(args, "quiet", 0) or 0) - int(getattr(args, "verbose", 0) or 0))
    )
    return LOG_LEVELS[1 + step]
