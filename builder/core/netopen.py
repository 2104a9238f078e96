"""The opener a fetch of core/net.py uses and what it follows: the watched http(s) handlers, redirects to http(s)://
only (at most ``MAX_REDIRECTS``), file:// only for a file:// URL; and which failures to open a connection are worth
another try (``transient``)."""

from __future__ import annotations

import socket
import ssl
import urllib.parse
import urllib.request
from typing import Any

from builder.core.errors import SourceError
from builder.core.watchdog import Watch, WatchedHTTPHandler, WatchedHTTPSHandler

MAX_REDIRECTS = 5  # one fetch follows at most this many, each to http(s) only


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s):// only (urllib's own also follows ftp://), at most MAX_REDIRECTS per fetch."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 2

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any) -> Any:
        target = urllib.parse.urljoin(req.full_url, headers.get("Location") or headers.get("URI") or "")
        if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
            raise RedirectRefused(f"{req.full_url}: redirected to {target[:200]}, which is not http(s)://; refused",
                                  "check what the index links there")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class RedirectRefused(SourceError):
    """A redirect this policy does not follow (to another scheme, or too many)."""


def opener(watch: Watch, timeouts: tuple[float, float], *, local: bool) -> urllib.request.OpenerDirector:
    """An opener with exactly the handlers a fetch may use: the watched http(s) ones and the redirect rule above;
    file:// only for a file:// URL (never reached by a redirect); no ftp://, data: or proxies' other schemes."""
    opener = urllib.request.OpenerDirector()
    handlers: list[urllib.request.BaseHandler] = [
        urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), urllib.request.HTTPDefaultErrorHandler(),
        _Redirects(), urllib.request.HTTPErrorProcessor(), WatchedHTTPHandler(watch, *timeouts),
        WatchedHTTPSHandler(watch, *timeouts)]
    if local:
        handlers.append(urllib.request.FileHandler())
    for handler in handlers:
        opener.add_handler(handler)
    return opener


# Failures to open an http(s) connection worth another try. A refused connection (nothing listens there), an
# unknown host, a bad certificate or a missing file:// are answers, not accidents: they are raised at once.
_RETRIED = (TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError,
            ssl.SSLZeroReturnError)


def transient(request: urllib.request.Request, reason: object) -> bool:
    if request.type not in ("http", "https"):
        return False
    if isinstance(reason, socket.gaierror):
        return reason.errno == socket.EAI_AGAIN  # the resolver is busy; an unknown name stays unknown
    return isinstance(reason, _RETRIED)
