"""An operation's deadline as a watchdog (core/net.py's policy): a timer that shuts down every socket the operation
opened when the deadline passes, whatever phase a read is blocked in, and the urllib handlers whose connections it
watches."""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import time
import urllib.request
from typing import Any


class Expired(Exception):
    """The operation's deadline passed."""


class Watch:
    """An operation's deadline: when it passes, every socket the operation opened is shut down, which wakes a
    read blocked in any phase; the reader then sees ``expired`` and stops."""

    def __init__(self, deadline_s: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + deadline_s
        self.expired = False
        self.received = 0  # body bytes, over all tries: what a drip server sent before the deadline
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def check(self) -> None:
        if self.expired or self.remaining() <= 0:
            self.expired = True
            raise Expired

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def stop(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    """Shut the connection down under any thread blocked on it (the plain socket's call: a TLS socket's own
    would tear down its TLS state under the reader)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class _Watched:
    """An http.client connection whose socket the watch can shut down; connecting is bounded by the connect
    timeout (and what is left of the deadline), each read by the read timeout."""

    sock: socket.socket
    timeout: float | None

    def __init__(self, *args: Any, watch: Watch, connect_timeout_s: float, read_timeout_s: float | None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch, self._connect_timeout_s, self._read_timeout_s = watch, connect_timeout_s, read_timeout_s

    def connect(self) -> None:
        self._watch.check()
        self.timeout = max(0.1, min(self._connect_timeout_s, self._watch.remaining()))
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self._read_timeout_s)
        self._watch.add(self.sock)


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _WatchedOpener:
    """The half of a urllib handler that opens each connection as ``connection`` with the watch and timeouts."""

    connection: type[_HTTPConnection | _HTTPSConnection]

    def __init__(self, watch: Watch, connect_timeout_s: float, read_timeout_s: float | None) -> None:
        super().__init__()
        self._connection = functools.partial(self.connection, watch=watch, connect_timeout_s=connect_timeout_s,
                                             read_timeout_s=read_timeout_s)


class WatchedHTTPHandler(_WatchedOpener, urllib.request.HTTPHandler):
    connection = _HTTPConnection

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)


class WatchedHTTPSHandler(_WatchedOpener, urllib.request.HTTPSHandler):
    connection = _HTTPSConnection

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)
