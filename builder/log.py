"""Progress output. Library code reports through ``log``; only the CLI decides verbosity.

Lines carry a ``name-version:`` prefix while a target is being processed, so one target's story can be grepped.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from rich.console import Console
from rich.markup import escape

_prefix: ContextVar[str] = ContextVar("builder_log_prefix", default="")


class Log:
    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet = False

    def _emit(self, style: str, text: str) -> None:
        if self.quiet and style not in ("red", "yellow"):
            return
        prefix = _prefix.get()
        self.console.print(f"[{style}]{escape(prefix)}{escape(text)}[/{style}]")

    def step(self, text: str) -> None:
        """A pipeline stage starting (bold)."""
        self._emit("bold cyan", f"==> {text}")

    def info(self, text: str) -> None:
        self._emit("default", text)

    def ok(self, text: str) -> None:
        self._emit("green", text)

    def warning(self, text: str) -> None:
        self._emit("yellow", f"warning: {text}")

    def error(self, text: str) -> None:
        self._emit("red", text)

    def command(self, argv: Sequence[str]) -> None:
        """Echo a subprocess as ``+ cmd`` before it runs."""
        self._emit("dim", "+ " + shlex.join(str(a) for a in argv))

    @contextmanager
    def status(self, text: str, heartbeat_s: float = 30.0) -> Iterator[Callable[[str], None]]:
        """A spinner for a long step when attached to a terminal; a plain line otherwise.

        Yields ``update(detail)``: on a terminal it rewrites the spinner's text; elsewhere (CI logs) it prints
        ``text: detail`` at most once every ``heartbeat_s`` seconds, so a long step shows it is alive.
        """
        prefix = _prefix.get()
        if self.console.is_terminal and not self.quiet:
            with self.console.status(escape(prefix + text)) as spinner:
                yield lambda detail: spinner.update(escape(f"{prefix}{text}: {detail}"))
        else:
            self.info(text)
            last = time.monotonic()

            def update(detail: str) -> None:
                nonlocal last
                if time.monotonic() - last >= heartbeat_s:
                    last = time.monotonic()
                    self.info(f"{text}: {detail}")

            yield update


log = Log()


@contextmanager
def target_prefix(prefix: str) -> Iterator[None]:
    token = _prefix.set(f"{prefix}: " if prefix else "")
    try:
        yield
    finally:
        _prefix.reset(token)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
