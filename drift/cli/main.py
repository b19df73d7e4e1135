"""`drift` entry point: settles every option's value once, runs one command, maps how it ended
to the exit-code convention (drift.cli._exits).

An option's value comes from, highest first: the command line, the environment, the config
file, the flag's default (drift.cli._settings). Global options (--log_level, -v, -q,
--config) go before or after the command.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from drift.cli._exits import USAGE, UsageError, interrupted, run_command
from drift.cli._options import add_global_options, log_level
from drift.cli._secrets import warn_secret_flags
from drift.cli._settings import apply_settings, load_config, settable_actions
from drift.openmp import bound_spinning
from drift.wire.version import __version__

# One module per subcommand, in the order `drift --help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "up",
    "down",
    "demo",
    "generate",
    "status",
    "dht",
    "server",
    "api",
)
EXIT_CODES_HELP = "exit codes: 0 ok, 1 runtime failure, 2 usage error, 130 interrupted"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drift",
        description="Run one large language model across a private cluster of your own machines.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"drift {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"drift.cli.{name}").add_parser(sub)
    for command in subcommands(parser).values():
        add_global_options(command, suppress=True)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def given_on_command_line(argv: Sequence[str]) -> dict[str, object]:
    """The options the command line itself sets (dest -> value), and `command`."""
    parser = build_parser()
    for p in (parser, *subcommands(parser).values()):
        for action in p._actions:
            action.default = argparse.SUPPRESS
            action.required = False
    return vars(parser.parse_known_args(list(argv))[0])


def parse_args(argv: Sequence[str] | None = None,
               env: Mapping[str, str] | None = None) -> argparse.Namespace:  # fmt: skip
    """The parsed command line with every option settled (flag > env > file > default).
    UsageError for a bad environment value or config file; SystemExit(2) for a bad flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    parser = build_parser()
    if any(a in ("-h", "--help", "--version") for a in argv):
        return parser.parse_args(argv)  # prints and exits 0
    given = given_on_command_line(argv)
    command = given.get("command")
    command = command if isinstance(command, str) else None
    config, config_path = load_config(given.get("config"), env)  # type: ignore[arg-type]
    commands = subcommands(parser)
    known = set().union(*(settable_actions(p) for p in (parser, *commands.values())))
    for key, value in config.items():
        if isinstance(value, dict) and key not in commands:
            raise UsageError(f"{config_path}: [{key}] is not a drift command")
        if not isinstance(value, dict) and key not in known:
            raise UsageError(f"{config_path}: no drift command has an option {key!r}")
    targets = [parser] + ([commands[command]] if command else [])
    for target in targets:
        apply_settings(target, given=set(given), command=command if target is not parser else None,
                       env=env, config=config, config_path=config_path)  # fmt: skip
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def unblock_stop_signals() -> None:
    """Take SIGINT / SIGTERM even if the parent held them when it started us (drift demo
    holds them while it starts a server, so that Ctrl+C cannot orphan the new process)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bound_spinning(os.environ)  # before any command module imports torch
    unblock_stop_signals()
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"drift: error: {exc.message}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:  # Ctrl+C while the commands' modules import
        print("\ndrift: interrupted", file=sys.stderr)
        return interrupted()
    if not getattr(args, "func", None):
        build_parser().print_help()
        return USAGE
    configure_logging(log_level(args))
    warn_secret_flags(argv)
    args.argv = argv  # the command line as given (drift up --print-service repeats it)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
