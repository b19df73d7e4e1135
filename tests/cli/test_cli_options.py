"""The CLI is one tool: options that mean the same thing have one name, default and help.

Read from the real parser (drift.cli.main.build_parser), so a command that redefines a
shared option by hand, with other words or another default, fails here.
"""

from __future__ import annotations

import argparse

import pytest

from drift.cli.main import build_parser

NODE_COMMANDS = ("dht", "server", "up")
NODE_FLAGS = ("--host", "--port", "--host_maddrs", "--announce_maddrs", "--public_ip",
              "--identity_path", "--initial_peers", "--swarm_key", "--gossip_interval",
              "--record_ttl", "--fanout", "--cache_dir")  # fmt: skip
SHARED_FLAGS = ("--swarm_key", "--cache_dir", "--torch_dtype", "--device", "--initial_peers")
# Commands not yet on the shared options (none).
PENDING: set[str] = set()


def commands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def flag(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    return next((a for a in parser._actions if name in a.option_strings), None)


def signature(action: argparse.Action) -> tuple:
    default = tuple(action.default) if isinstance(action.default, list) else action.default
    return (action.dest, default, action.help, action.type, action.nargs, action.choices)


@pytest.mark.parametrize("name", NODE_FLAGS)
def test_node_commands_share_every_node_option(name: str) -> None:
    cmds = commands()
    found = {c: flag(cmds[c], name) for c in NODE_COMMANDS}
    assert all(found.values()), f"{name} missing in " + ", ".join(
        c for c, a in found.items() if not a
    )
    sigs = {c: signature(a) for c, a in found.items() if a is not None}
    assert len(set(sigs.values())) == 1, sigs


def test_shared_options_agree_across_all_commands() -> None:
    seen: dict[str, dict[str, tuple]] = {}
    for cmd, parser in commands().items():
        if cmd in PENDING:
            continue
        for name in SHARED_FLAGS:
            action = flag(parser, name)
            if action is not None:
                # --initial_peers is required where a command cannot work without a swarm
                sig = signature(action)[:4] if name == "--initial_peers" else signature(action)
                seen.setdefault(name, {})[cmd] = sig
    for name, by_cmd in seen.items():
        assert len(set(by_cmd.values())) == 1, (name, by_cmd)
    assert len(seen["--swarm_key"]) >= 5 and len(seen["--cache_dir"]) >= 6


def test_model_to_serve_is_the_same_argument_everywhere() -> None:
    cmds = commands()
    served = [
        next(a for a in cmds["up"]._actions if a.dest == "model"),
        next(a for a in cmds["server"]._actions if a.dest == "model"),
        flag(cmds["demo"], "--model"),
    ]
    assert len({(a.default, a.help) for a in served if a is not None}) == 1


def test_up_takes_join_as_initial_peers() -> None:
    parser = build_parser()
    token = "drift://12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN@10.0.0.1:31337"
    for spelling in ("--join", "--initial_peers"):
        args = parser.parse_args(["up", spelling, token])
        assert args.initial_peers == [token]


def test_listen_address_defaults_and_multiaddr() -> None:
    from drift.cli._options import listen_address

    parser = build_parser()
    for cmd in NODE_COMMANDS:
        extra = ["m"] if cmd == "server" else []
        assert listen_address(parser.parse_args([cmd, *extra])) == ("0.0.0.0", 31337)
        args = parser.parse_args([cmd, *extra, "--host", "127.0.0.1", "--port", "0"])
        assert listen_address(args) == ("127.0.0.1", 0)
        args = parser.parse_args([cmd, *extra, "--host_maddrs", "/ip4/127.0.0.1/tcp/4242",
                                  "--port", "5"])  # fmt: skip
        assert listen_address(args) == ("127.0.0.1", 4242)


def test_initial_peers_never_swallows_a_positional() -> None:
    """`drift generate --initial_peers TOKEN "prompt"` as the issue writes it; commas or a
    repeated flag give several tokens."""
    parser = build_parser()
    args = parser.parse_args(["generate", "--initial_peers", "drift://a@h:1", "hello there"])
    assert (args.initial_peers, args.prompt) == (["drift://a@h:1"], "hello there")
    args = parser.parse_args(["up", "--join", "drift://a@h:1, drift://b@h:2", "smollm2"])
    assert (args.initial_peers, args.model) == (["drift://a@h:1", "drift://b@h:2"], "smollm2")
    args = parser.parse_args(["dht", "--initial_peers", "x", "--initial_peers", "y"])
    assert args.initial_peers == ["x", "y"]
