"""Network bounds that outlive one fetch (issue 54), used by core/net.py's ``open_url``:

- ``Budget``: one deadline many fetches share. All torch-index reads of one command (a page, then the METADATA of
  each new release, in several threads) run inside one ``scope``; 200 releases whose METADATA drips cost the
  network deadline once, not 200 times (about 4 h at the default).
- failures remembered for the command's life: a host that gave no answer at all before the policy gave up (a
  silent PyPI) is not asked again by this process, nor a URL that kept failing (HTTP 5xx): the next fetch fails at
  once with the first failure's line. A PyPI that does not answer then costs one deadline, not one per step that
  needs the release list (38 in one ``coverage``, 64 in ``matrix``). A process that runs longer than
  ``REMEMBER_S`` (a watch loop) asks again after that.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from types import TracebackType

REMEMBER_S = 3600.0


class Budget:
    """A deadline shared by every fetch made inside its outermost ``scope`` (from any thread); no scope open, no
    bound beyond each fetch's own."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seconds = 0.0
        self._end: float | None = None
        self._depth = 0
        self._lock = threading.Lock()

    def scope(self, seconds: float) -> BudgetScope:
        return BudgetScope(self, seconds)

    def remaining(self) -> float | None:
        """Seconds left; None when no scope is open."""
        end = self._end
        return None if end is None else end - time.monotonic()

    def _enter(self, seconds: float) -> None:
        with self._lock:
            if self._depth == 0:
                self._end, self.seconds = time.monotonic() + seconds, seconds
            self._depth += 1

    def _exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._end = None


class BudgetScope:
    """``with budget.scope(seconds):`` the outermost one starts the shared deadline, nested ones join it."""

    def __init__(self, budget: Budget, seconds: float) -> None:
        self.budget, self.seconds = budget, seconds

    def __enter__(self) -> Budget:
        self.budget._enter(self.seconds)
        return self.budget

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.budget._exit()


_FAILED: dict[str, tuple[float, str, str]] = {}  # a URL or an origin → (when, the failure's line, its cure)
_LOCK = threading.Lock()


def origin(url: str) -> str:
    """``https://pypi.org`` of ``https://pypi.org/pypi/x/json``: what a silent host is remembered by."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def remember(key: str, message: str, hint: str) -> None:
    with _LOCK:
        _FAILED[key] = (time.monotonic(), message, hint)


def recall(url: str) -> tuple[str, str] | None:
    """(line, cure) of a failure remembered for ``url`` or its host in the last REMEMBER_S; None if none."""
    now = time.monotonic()
    with _LOCK:
        for key in (url, origin(url)):
            found = _FAILED.get(key)
            if found is not None and now - found[0] < REMEMBER_S:
                return found[1], found[2]
    return None


def forget() -> None:
    """Forget every remembered failure (a test; a long-lived process that knows the network is back)."""
    with _LOCK:
        _FAILED.clear()
