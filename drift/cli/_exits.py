"""The one exit-code convention of every `drift` command, applied in one place.

    0    ok (also: a server stopped by SIGTERM, e.g. `drift down`, after leaving gracefully)
    1    runtime failure (unreachable peer, busy port, model that cannot be opened, ...)
    2    usage error (unknown flag, bad value, missing argument; argparse's own code)
    130  interrupted (Ctrl+C / SIGINT, at any point: loading, reading the swarm, serving)

Commands raise `UsageError` (or wrap argument checks in `usage_errors()`) for 2 and let
DriftError / OSError / KeyboardInterrupt propagate; `run_command` turns each into its code
and a one-line message (no traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import sys
from collections.abc import Iterator

from drift.wire.errors import DriftError

OK = 0
FAILURE = 1
USAGE = 2
INTERRUPTED = 130


class UsageError(Exception):
    """The command line (or its environment / config file) asks for something invalid."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Inside: a DriftError (e.g. BadRequest from checking a flag's value) is a usage error."""
    try:
        yield
    except DriftError as exc:
        raise UsageError(exc.message) from exc


def os_error_message(exc: OSError) -> str:
    """One line for an OSError; a busy port says what to do about it."""
    text = str(exc.strerror or exc)
    if exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower():
        return (f"{text}: another drift (see `drift down --list`) or another program holds "
                "the port; pick another with --port")  # fmt: skip
    return text


def interrupted() -> int:
    """INTERRUPTED, for a KeyboardInterrupt that was caught: the exit code stays 130.

    CPython flags a KeyboardInterrupt that leaves code run from a string (`exec(str)`,
    as dataclasses and namedtuple do at import) as "unhandled", and on exit kills the process
    with SIGINT (status -2) even when the exception was caught further up. A Ctrl+C that
    lands while a module imports would then end the command by signal. Running a string
    that completes clears the flag again.
    """
    exec("pass")  # noqa: S102 -- clears CPython's unhandled-KeyboardInterrupt flag (above)
    return INTERRUPTED


def run_command(args: argparse.Namespace, *, prog: str = "drift") -> int:
    """Run the parsed command; map how it ended to the convention above, message on stderr."""
    name = f"{prog} {args.command}"
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{name}: error: {exc.message}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted", file=sys.stderr)
        return interrupted()
    except DriftError as exc:
        print(f"{name}: {exc.message}", file=sys.stderr)
        return FAILURE
    except OSError as exc:
        print(f"{name}: {os_error_message(exc)}", file=sys.stderr)
        return FAILURE
