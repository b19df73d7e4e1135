"""`drift` entry point: parses arguments once and hands them to one subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drift",
        description="Run one large language model across a private cluster of your own machines.",
    )
    parser.add_argument("--version", action="version", version=f"drift {__version__}")
    parser.add_argument(
        "--log_level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity (default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"drift.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
