"""One network policy for every fetch: connect and read timeouts, a deadline per operation, retries with backoff.

A *read timeout* alone does not bound a download: a server that drips one byte every few seconds never lets a
read time out, and urllib's ``timeout=`` is exactly such a per-read limit. So each operation (one URL: its
redirects, every retry and the pauses between them) runs under a watchdog that shuts its sockets down when the
deadline passes, whatever phase it is in (connecting, waiting for headers, streaming the body), and the reader
checks the deadline between chunks. When the policy gives up it raises ``NetError``: one line naming the URL, the
deadline and the settings that change it. ``NetError`` is a ``SourceError`` (the CLI prints it and exits 4) and a
``TimeoutError`` (callers that fall back to a cache on ``OSError``, as the torch index listing does, still do).

Retried: a timeout, a connection reset or closed early, an answer shorter than its Content-Length, HTTP
408/425/429/5xx. Not retried, because they are answers rather than accidents: a refused connection (nothing
listens there), an unknown host, a bad certificate, HTTP 404 and other 4xx (raised as urllib's HTTPError, as
urlopen would), a missing file://.

uv subprocesses get the same bounds through their environment (``NetPolicy.uv_env``: ``UV_HTTP_TIMEOUT``,
``UV_HTTP_CONNECT_TIMEOUT``, ``UV_HTTP_RETRIES``; ``use`` exports them for every uv the CLI starts); uv's
timeout is per read too, so ``uvtool.run_uv`` adds a wall-clock limit (``uv_deadline_s``). git gets a low-speed
limit (``NetPolicy.git_env``). Defaults: the ``NetPolicy`` fields; the variables that change them: ``SETTINGS``
(read by ``NetPolicy.from_env``); the CLI's ``--net-deadline`` overrides the deadline.
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from builder.core import netbudget, netfault, netopen
from builder.core.errors import SourceError, UsageError
from builder.core.netbudget import Budget, BudgetScope, forget
from builder.core.netopen import MAX_REDIRECTS, RedirectRefused
from builder.core.watchdog import Expired, Watch

# re-exported: callers name one module for the network
__all__ = ["MAX_REDIRECTS", "Budget", "BudgetScope", "RedirectRefused", "forget"]

CHUNK = 1 << 16
# The most seconds any bound may be (a month): threading.Timer and time_t overflow long before 1e300.
MAX_SECONDS = 30 * 86400.0
MAX_RETRIES = 100
# HTTP answers worth asking again: the server (or a proxy in front of it) is overloaded or restarting.
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
USER_AGENT = "cuda-wheel-builder"

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class NetPolicy:
    """How long any fetch may take. Seconds throughout; ``retries`` counts the tries after the first."""

    connect_timeout_s: float = 10.0  # to open a connection (TCP and TLS)
    read_timeout_s: float = 30.0  # the longest wait for the next byte
    deadline_s: float = 300.0  # one operation, all tries and pauses included
    retries: int = 2  # after a timeout, a reset connection or an HTTP 5xx/429
    backoff_s: float = 1.0  # the pause before the first retry; doubled before each next one
    uv_deadline_s: float = 1800.0  # one uv command (it may download a multi-GiB CUDA torch)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: float | int | None) -> NetPolicy:
        """The policy ``env`` sets (``SETTINGS`` names the variables); ``overrides`` that are not None win
        (a CLI flag). A value that is not a positive number is a UsageError naming the variable."""
        values: dict[str, Any] = {}
        for name, var in SETTINGS.items():
            if env.get(var, "").strip():
                values[name] = _number(var, env[var], integer=name == "retries")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def uv_env(self) -> dict[str, str]:
        """uv's own variables for the same bounds (whole seconds: uv reads integers)."""
        return {"UV_HTTP_TIMEOUT": str(math.ceil(self.read_timeout_s)),
                "UV_HTTP_CONNECT_TIMEOUT": str(math.ceil(self.connect_timeout_s)),
                "UV_HTTP_RETRIES": str(self.retries)}

    def git_env(self) -> dict[str, str]:
        """git's own variables for the same bounds: a transfer slower than 1 KB/s for a read timeout is cut
        (git has no per-read timeout; its wall clock is the caller's ``timeout=deadline_s``)."""
        return {"GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": str(math.ceil(self.read_timeout_s))}


# field → the environment variable that sets it
SETTINGS: dict[str, str] = {
    "connect_timeout_s": "BUILDER_NET_CONNECT_TIMEOUT",
    "read_timeout_s": "BUILDER_NET_TIMEOUT",
    "deadline_s": "BUILDER_NET_DEADLINE",
    "retries": "BUILDER_NET_RETRIES",
    "backoff_s": "BUILDER_NET_BACKOFF",
    "uv_deadline_s": "BUILDER_UV_DEADLINE",
}
assert set(SETTINGS) == {f.name for f in fields(NetPolicy)}

DEADLINE_CURE = "raise the deadline: BUILDER_NET_DEADLINE=SECONDS or --net-deadline SECONDS"


def _number(var: str, text: str, *, integer: bool) -> float | int:
    try:
        value: float | int = int(text) if integer else float(text)
    except ValueError:
        value = -1
    high = MAX_RETRIES if integer else MAX_SECONDS
    if not (0 <= value <= high if integer else 0 < value <= high):  # nan fails both comparisons
        kind = f"a whole number of tries (0 to {high})" if integer else f"a positive number of seconds (at most {high:.0f})"
        raise UsageError(f"{var}={text!r} is not {kind}", f"set {var} to e.g. {getattr(NetPolicy(), _field(var))}")
    return value


def seconds(text: str) -> float:
    """argparse's type for a flag of seconds (``--net-deadline``, ``--timeout``): a positive number, at most
    ``MAX_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_SECONDS:  # nan and inf fail it too
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (at most {MAX_SECONDS:.0f})")
    return value


def _field(var: str) -> str:
    return next(name for name, v in SETTINGS.items() if v == var)


# ---------------------------------------------------------------- the process's policy

_CURRENT: list[NetPolicy] = []


def use(policy: NetPolicy, environ: MutableMapping[str, str] | None = None) -> None:
    """Make ``policy`` the one every fetch of this process follows (the CLI calls this once, from its flags and
    environment); with ``environ`` (``os.environ``), uv processes started from here inherit the same bounds,
    unless the user set uv's own variables there."""
    _CURRENT[:] = [policy]
    if environ is not None:
        for key, value in policy.uv_env().items():
            environ.setdefault(key, value)


def current() -> NetPolicy:
    """The policy ``use`` set, else the one the environment sets."""
    return _CURRENT[0] if _CURRENT else NetPolicy.from_env(os.environ)


# ---------------------------------------------------------------- errors


class NetError(SourceError, TimeoutError):
    """A fetch the policy gave up on. A SourceError for the CLI, a TimeoutError (an OSError) for callers that
    fall back to a cache when the network fails."""

    def __str__(self) -> str:
        return self.message


class _Retry(Exception):
    """One try failed in a way worth another (``cause`` says how, ``cure`` what to do if it keeps failing)."""

    def __init__(self, cause: str, cure: str = "", *, answered: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.cure = cure
        self.answered = answered  # the server said something (an HTTP status, part of a body)


class TooLarge(SourceError):
    """An answer longer than its caller's cap (a page, a record, a wheel past its declared size); not retried."""


# ---------------------------------------------------------------- the ding


class Body:
    """An open answer, read in chunks with the deadline checked between them. A failure while reading is
    another try for ``open_url`` (the reader is called again from the start)."""

    def __init__(self, response: Any, watch: Watch, timeout_s: float, max_bytes: int | None = None) -> None:
        self._response, self._watch, self._timeout = response, watch, timeout_s
        self.max_bytes = max_bytes
        self.status: int = getattr(response, "status", None) or 200
        self.headers: Any = response.headers
        self.url: str = response.geturl()
        self.received = 0
        declared = self.headers.get("Content-Length") if self.headers is not None else None
        if max_bytes is not None and declared and declared.strip().isdigit() and int(declared) > max_bytes:
            raise self._too_large(f"says Content-Length {int(declared)}")

    def _too_large(self, how: str) -> TooLarge:
        return TooLarge(f"{self.url}: the answer {how}, more than the {self.max_bytes} bytes it may have; refused",
                        "check what the index links there")

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        """The body in chunks; past ``max_bytes`` a TooLarge, before the chunk that crosses it is yielded."""
        read = getattr(self._response, "read1", self._response.read)
        if self.max_bytes is not None:
            size = max(1, min(size, self.max_bytes + 1))
        while True:
            self._watch.check()
            try:
                chunk = read(size)
            except (OSError, http.client.HTTPException) as e:
                self._watch.check()
                raise _Retry(f"the answer broke off after {self.received} bytes ({_describe(e, self._timeout)})",
                             netfault.connection(e)[1], answered=True) from e
            self._watch.check()  # a watchdog's shutdown reads as the end of the answer: it is not
            if not chunk:
                break
            if self.max_bytes is not None and self.received + len(chunk) > self.max_bytes:
                raise self._too_large(f"went on past {self.received + len(chunk)} bytes")
            self.received += len(chunk)
            self._watch.received += len(chunk)
            yield chunk
        left = getattr(self._response, "length", None)
        if left:  # http.client's read1 ends quietly when the connection closes before Content-Length
            raise _Retry(f"the answer ended {left} bytes short of its Content-Length",
                         netfault.connection(ConnectionResetError())[1], answered=True)

    def read(self) -> bytes:
        return b"".join(self.chunks())


_OPENED: list[str] = []  # every http(s) URL this process asked for, in order (``opened``)


def opened() -> tuple[str, ...]:
    """The http(s) URLs this process has asked for so far: a read-only command says what it fetched when cold."""
    return tuple(_OPENED)


def open_url(url: str, read: Callable[[Body], _T], *, headers: Mapping[str, str] | None = None,
             method: str = "GET", policy: NetPolicy | None = None, max_bytes: int | None = None,
             within: Budget | None = None) -> _T:
    """``read(body)`` of the answer at ``url`` (http(s):// under the policy; file:// too), retried with backoff
    on a timeout, a broken connection or HTTP 408/429/5xx: ``read`` must start its output afresh each time.

    Other HTTP errors (404…) and a missing file:// raise urllib's own errors, as urlopen does. Giving up (the
    deadline passed, or the retries ran out) raises NetError. ``max_bytes`` caps the body (TooLarge past it).
    Only http(s):// and file:// are fetched; a redirect is followed to http(s):// only, at most MAX_REDIRECTS
    times, within the same deadline (urllib alone follows one to ftp://, which no watchdog bounds). ``within``: a
    deadline this fetch shares with others (core/netbudget.py). A host that gave no answer, or a URL that kept
    failing, earlier in this process is not asked again: the first failure's NetError is raised at once."""
    policy = policy or current()
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https", "file"):
        raise SourceError(f"{url}: not an http(s):// or file:// URL; refused", "check what the index links there")
    if scheme != "file":
        known = netbudget.recall(url)
        if known is not None:
            raise NetError(f"{url}: not asked again: {known[0]}", known[1])
        _OPENED.append(url)
    shared = within.remaining() if within is not None else None
    # the shared deadline binds (it began earlier): a failure then may be the budget's, not the host's
    capped = shared is not None and shared < policy.deadline_s - max(0.05, policy.deadline_s / 100)
    if within is not None and shared is not None and shared <= 0:
        raise NetError(f"{url}: not asked: the {within.what} of this command took their whole {within.seconds:g} s "
                       "network deadline", f"check that the index answers, or {DEADLINE_CURE}")
    watch = Watch(policy.deadline_s if shared is None else min(policy.deadline_s, shared))
    bound = replace(policy, deadline_s=within.seconds) if capped and within is not None else policy
    request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT, **(headers or {})})
    opener = netopen.opener(watch, (policy.connect_timeout_s, policy.read_timeout_s), local=scheme == "file")
    tries, cause, cure, answered = 0, "", "", False
    heard: list[bool] = []  # _try appends when the server answered (headers came): then it is not silent
    try:
        while True:
            tries += 1
            try:
                return _try(opener, request, read, watch, policy, max_bytes, heard)
            except _Retry as e:
                cause, cure, answered = e.cause, e.cure, answered or e.answered
            except Expired:
                raise _remembered(capped, url, _gave_up(url, bound, watch, tries, cause), answered or bool(heard)) \
                    from None
            pause = policy.backoff_s * 2 ** (tries - 1)
            if tries > policy.retries:
                raise _remembered(capped, url, _gave_up(url, bound, watch, tries, cause, cure=cure),
                                  answered or bool(heard))
            if watch.expired or pause >= watch.remaining():
                raise _remembered(capped, url, _gave_up(url, bound, watch, tries, cause, deadline=True),
                                  answered or bool(heard))
            time.sleep(pause)
    finally:
        watch.stop()


def _remembered(capped: bool, url: str, error: NetError, answered: bool) -> NetError:
    """``error``, remembered for this process (core/netbudget.py): by host when nothing ever answered, else by URL;
    not when a shared deadline (``capped``), rather than the host, ended it."""
    if not capped:
        netbudget.remember(url if answered else netbudget.origin(url), error.message, error.hint or "")
    return error


def _try(opener: urllib.request.OpenerDirector, request: urllib.request.Request, read: Callable[[Body], _T],
         watch: Watch, policy: NetPolicy, max_bytes: int | None, heard: list[bool]) -> _T:
    watch.check()
    try:
        response = opener.open(request, timeout=policy.read_timeout_s)
        heard.append(True)
    except urllib.error.HTTPError as e:
        if e.code in (301, 302, 303, 307, 308):
            raise RedirectRefused(f"{request.full_url}: more than {MAX_REDIRECTS} redirects (or a loop); refused",
                                  "check the URL") from None
        if e.code not in TRANSIENT_STATUS:
            raise
        e.close()
        raise _Retry(f"answered HTTP {e.code}", netfault.http_status(e.code)[1], answered=True) from None
    except urllib.error.URLError as e:
        watch.check()
        if not netopen.transient(request, e.reason):
            raise
        raise _Retry(_describe(e.reason, policy.read_timeout_s), netfault.connection(e.reason)[1]) from None
    except (OSError, http.client.HTTPException) as e:  # a connection dropped or timed out before the headers
        watch.check()
        raise _Retry(_describe(e, policy.read_timeout_s), netfault.connection(e)[1]) from None
    with response:
        return read(Body(response, watch, policy.read_timeout_s, max_bytes))


def _describe(error: object, timeout_s: float) -> str:
    if isinstance(error, TimeoutError) or (isinstance(error, OSError) and "timed out" in str(error)):
        return f"nothing came for {timeout_s:g} s"
    text = str(error) or type(error).__name__
    return text if len(text) < 160 else text[:157] + "…"


def _gave_up(url: str, policy: NetPolicy, watch: Watch, tries: int, cause: str, *,
             deadline: bool = False, cure: str = "") -> NetError:
    took = f"{watch.elapsed():.0f} s, {tries} tr{'y' if tries == 1 else 'ies'}"
    if watch.expired or deadline:
        if watch.received:
            cause = f"{watch.received} bytes came, the answer still incomplete"
        return NetError(f"{url}: gave up at the {policy.deadline_s:g} s network deadline ({took}; "
                        f"{cause or 'no answer'})", f"check that it answers, or {DEADLINE_CURE}")
    return NetError(f"{url}: gave up after {took} within the {policy.deadline_s:g} s network deadline ({cause})",
                    cure or "check that it answers; more tries with BUILDER_NET_RETRIES=N, longer waits for a byte "
                    "with BUILDER_NET_TIMEOUT=SECONDS")


def fetch_bytes(url: str, *, headers: Mapping[str, str] | None = None, policy: NetPolicy | None = None,
                max_bytes: int | None = None) -> bytes:
    """The whole answer at ``url`` under the policy (``open_url``), at most ``max_bytes`` of it."""
    return open_url(url, lambda body: body.read(), headers=headers, policy=policy, max_bytes=max_bytes)


def download(url: str, dest: Path, *, policy: NetPolicy | None = None) -> int:
    """Stream the answer at ``url`` into ``dest`` (rewritten from the start on each try); its size."""

    def copy(body: Body) -> int:
        size = 0
        with dest.open("wb") as out:
            for chunk in body.chunks():
                out.write(chunk)
                size += len(chunk)
        return size

    return open_url(url, copy, policy=policy)


def with_read_timeout(policy: NetPolicy, read_timeout_s: float | None) -> NetPolicy:
    """``policy`` with a command's own per-read timeout (``index pull --timeout``), where one is given."""
    return policy if read_timeout_s is None else replace(policy, read_timeout_s=read_timeout_s)
