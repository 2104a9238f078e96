"""Command line: argv → the command's handler → rendered output. The only place that catches BuilderError."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import NoReturn

from builder import __version__
from builder.cli import cache, coverage, farm, images, index, matrix, targets, torch_table, user
from builder.cli.common import add_common
from builder.core.errors import BuilderError
from builder.core.log import log

# Each command module has register(subparsers, add_common) -> {command name: handler}.
COMMAND_MODULES = (targets, index, farm, matrix, images, cache, user, torch_table, coverage)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported like every other user error: one ``error:`` line naming the flag and the
    cure (its --help), exit 2, instead of the usage block. Subcommand parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def parser_and_handlers() -> tuple[argparse.ArgumentParser, dict]:
    """The argument parser and each command's handler, collected from the command modules."""
    parser = OneLineParser(prog="builder", description="Build verified CUDA extension wheels.")
    parser.add_argument("--version", action="version", version=f"cuda-wheel-builder {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict = {}
    for module in COMMAND_MODULES:
        handlers.update(module.register(sub, add_common))
    return parser, handlers


def build_parser() -> argparse.ArgumentParser:
    return parser_and_handlers()[0]


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (CI cancel, `timeout`) unwinds like Ctrl-C, so cleanup runs: temp dirs go, locks are released and
    child process groups (compiles, kernel tests) are stopped instead of orphaned."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser, handlers = parser_and_handlers()
    args = parser.parse_args(argv)
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main_thread else None
    try:
        return handlers[args.command](args)
    except BuilderError as e:
        if args.debug:
            raise
        log.error(f"error: {e.one_line()}")
        for line in e.extra:
            log.error(f"  {line}")
        return e.exit_code
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    except BrokenPipeError:  # `builder matrix | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
