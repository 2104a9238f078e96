"""Why a fetch failed, in words, and the cure that fits that fault (issue 40): an unknown host name, a refused
connection, a timeout, a TLS failure, HTTP 404 and HTTP 500 each have their own. Every caller that turns a
network failure into a message asks here (``explain``), so no fault gets another's cure ("start `builder serve`"
for a bad certificate, "wait longer for a byte" for HTTP 500)."""

from __future__ import annotations

import errno
import socket
import ssl
import urllib.error

RETRIES_CURE = "more tries with BUILDER_NET_RETRIES=N"


def explain(error: BaseException) -> tuple[str, str]:
    """(cause, cure) of a fetch that failed with ``error``: urllib's HTTPError or URLError, or the OSError under
    one. The cause reads after the URL: "http://h/x names a host that does not resolve (…)"."""
    if isinstance(error, urllib.error.HTTPError):
        return http_status(error.code)
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    return connection(reason)


def http_status(code: int) -> tuple[str, str]:
    """(cause, cure) of an HTTP error status."""
    if code in (404, 410):
        return f"is not there (HTTP {code})", "check the URL: the path after the host, and its spelling"
    if code in (401, 403, 407):
        return (f"refused access (HTTP {code})", "the server wants credentials this tool does not send: make the "
                "index readable from this machine, or copy it here (`builder index pull` where it can be read)")
    if code == 429:
        return "asked for fewer requests (HTTP 429)", f"wait a few minutes and run again; {RETRIES_CURE}"
    if 500 <= code < 600:
        return (f"failed on its side (HTTP {code})",
                f"the fault is the server's: check its log or status page, or run again later; {RETRIES_CURE}")
    return f"refused the request (HTTP {code})", "check the URL"


def connection(reason: object) -> tuple[str, str]:
    """(cause, cure) of a connection that failed before any answer (``reason``: URLError's, or an OSError)."""
    text = _text(reason)
    if isinstance(reason, socket.gaierror):
        if reason.errno == socket.EAI_AGAIN:
            return (f"names a host that could not be looked up now ({text})",
                    "check this machine's DNS and network, then run again (or --offline with a filled cache)")
        return (f"names a host that does not resolve ({text})",
                "check the host name in the URL (a typo?) and this machine's DNS")
    if isinstance(reason, ConnectionRefusedError):
        return ("refused the connection (nothing listens on that port)",
                "check the port in the URL and that the server runs there (`builder serve` serves a wheelhouse)")
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"has a TLS certificate this machine does not trust ({reason.verify_message or text})",
                "check that the URL names the right host; for a private certificate authority, point "
                "SSL_CERT_FILE at its CA bundle")
    if isinstance(reason, ssl.SSLError):
        return (f"failed the TLS handshake ({getattr(reason, 'reason', None) or text})",
                "check that the port speaks https (a plain http server, such as `builder serve`, needs http://)")
    if isinstance(reason, TimeoutError) or "timed out" in text:
        return (f"did not answer in time ({text})",
                "check the network path to it (a firewall or proxy dropping packets?); wait longer with "
                "BUILDER_NET_CONNECT_TIMEOUT=SECONDS (connecting) or BUILDER_NET_TIMEOUT=SECONDS (each byte); "
                f"{RETRIES_CURE}")
    if isinstance(reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return f"cut the connection ({text})", f"check the network path (a proxy?) and run again; {RETRIES_CURE}"
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return (f"is not reachable from this machine ({text})",
                "check this machine's network and routes (is it offline? then use --offline)")
    if isinstance(reason, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return f"is not there ({text})", "check the path"
    return f"could not be read ({text})", "check the URL and this machine's network"


def _text(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    text = str(reason) or type(reason).__name__
    return text if len(text) < 160 else text[:157] + "…"
