"""Progress output. Library code reports through ``log``; only the CLI decides verbosity.

Lines carry a ``name-version:`` prefix while a target is being processed, so one target's story can be grepped.
"""

from __future__ import annotations

import contextvars
import shlex
import threading
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
    def status(self, text: str, heartbeat_s: float = 30.0, *, each_change: bool = False
               ) -> Iterator[Callable[[str], None]]:
        """A long step with its elapsed time: a spinner on a terminal, plain lines otherwise (CI logs).

        Yields ``update(detail)``. On a terminal the spinner shows ``text: detail  2m31s``, its clock ticking
        every second. Elsewhere ``text`` is printed once, then ``text: detail (elapsed)`` at most once every
        ``heartbeat_s`` seconds and at least that often while the step runs (a silent 8-minute nvcc still
        shows it is alive); with ``each_change`` every new detail is printed at once too (one line per compile
        step: the caller passes only step changes).
        """
        if self.console.is_terminal and not self.quiet:
            with self._spinner(text) as update:
                yield update
        else:
            with self._plain_status(text, heartbeat_s, each_change) as update:
                yield update

    @contextmanager
    def _spinner(self, text: str) -> Iterator[Callable[[str], None]]:
        """A terminal's status line whose clock ticks every second."""
        prefix, start, detail, done = _prefix.get(), time.monotonic(), "", threading.Event()
        with self.console.status(escape(prefix + text)) as spinner:
            def show() -> None:
                spinner.update(escape(f"{prefix}{_status_line(text, detail)}  {elapsed(time.monotonic() - start)}"))

            def tick() -> None:
                while not done.wait(1.0):
                    show()

            def update(new: str) -> None:
                nonlocal detail
                detail = new
                show()

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            try:
                yield update
            finally:
                done.set()
                ticker.join()

    @contextmanager
    def _plain_status(self, text: str, heartbeat_s: float, each_change: bool) -> Iterator[Callable[[str], None]]:
        """Plain lines for logs: the text once, then a line per change (each_change) or heartbeat."""
        start, detail, done, lock = time.monotonic(), "", threading.Event(), threading.Lock()
        self.info(text)
        printed = time.monotonic()

        def emit() -> None:
            nonlocal printed
            printed = time.monotonic()
            self.info(f"{_status_line(text, detail)} ({elapsed(printed - start)})")

        def update(new: str) -> None:
            nonlocal detail
            with lock:
                changed, detail = new != detail, new
                if (each_change and changed) or time.monotonic() - printed >= heartbeat_s:
                    emit()

        def heartbeat() -> None:
            while not done.wait(max(1.0, min(heartbeat_s, 30.0) / 6)):
                with lock:
                    if time.monotonic() - printed >= heartbeat_s:
                        emit()

        # the thread sees this context's target prefix (ContextVars are per thread otherwise)
        beat = threading.Thread(target=contextvars.copy_context().run, args=(heartbeat,), daemon=True)
        beat.start()
        try:
            yield update
        finally:
            done.set()
            beat.join()


def _status_line(text: str, detail: str) -> str:
    short = detail if len(detail) <= DETAIL_CHARS else detail[:DETAIL_CHARS - 1] + "…"
    return f"{text}: {short}" if short else text


DETAIL_CHARS = 120  # a status detail longer than this is cut (raw output lines; compile steps are short)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 wheel``, ``2 wheels``, ``0 wheels``; ``nouns`` where the plural is not ``noun + "s"``."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def elapsed(seconds: float) -> str:
    """``45s``, ``2m31s``, ``1h02m``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


log = Log()


@contextmanager
def target_prefix(prefix: str) -> Iterator[None]:
    token = _prefix.set(f"{prefix}: " if prefix else "")
    try:
        yield
    finally:
        _prefix.reset(token)
