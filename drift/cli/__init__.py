"""The command line: the one place that builds things (composition root).

Each subcommand lives in its own module exposing `add_parser(subparsers)`; the parser it
adds sets `func` to a callable taking the parsed args and returning an exit code.
"""
