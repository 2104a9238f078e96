"""The connection layer of `builder serve`: a slow client costs a socket, never a thread.

One thread reads the request heads of every open connection with a selector; only a complete head is handed to one
of a fixed number of worker threads, which answers that one request and gives the connection back for the next
(keep-alive, pipelining). So 200 clients that drip one header byte a second hold 200 sockets in the selector and no
worker, and a normal request is answered at once. Deadlines per connection (``Limits``): the first byte of a request
within ``idle`` seconds (of the accept, or of the previous answer on a keep-alive connection: then the connection is
closed quietly), the whole head within ``head`` seconds of its first byte (else 408 and closed), and a client must take some bytes of an answer within every ``write`` seconds (one that stops
reading is dropped). A file's body is sent by the loop thread too (non-blocking ``sendfile``), so a client that
reads slowly holds a socket, not a worker. Its progress is the bytes the client's side has acknowledged (the send
queue's unacknowledged count, SIOCOUTQ, subtracted from what was handed to the kernel), looked at every ``write`` / 6
seconds: not the returns of ``sendfile``, which with a few MiB of send buffer come minutes apart for an honest
client reading at 16 KiB/s (issue 54); the unsent part of the queue is kept small (TCP_NOTSENT_LOWAT), so a
thousand slow readers do not pin a thousand send buffers. The whole answer must be read within ``write`` + size /
``min_rate`` seconds, else it is dropped. At most ``bodies`` file bodies over ``small_body`` bytes are sent at
once: a request for one more is answered 503 with ``Retry-After: 1`` and the connection closed, so that downloads
never hold every connection and a new client can still read pages (before issue 54, 520 downloads held all 512).
At most ``connections`` are open at once: a new one past the cap closes an idle keep-alive connection, else the
one that has waited longest for its request (the slowest head), with 503 and ``Retry-After: 1``; when none waits
(all are being answered or queued for a worker), the new one gets that 503 itself, before it costs anything.
Complete requests past the ``workers`` busy ones wait in a queue, not in the listen backlog.
Over 400 lines on purpose: the selector loop, the per-connection deadlines and the worker hand-off share one state
machine and one lock; split, each half would reach into the other's connection state.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import queue
import re
import selectors
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import HTTPServer

_HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-connection deadlines (seconds) and caps; the defaults are `builder serve`'s (docs/INDEX.md)."""

    idle: float = 5.0  # to the first byte of a request: a new connection, or keep-alive between requests
    head: float = 10.0  # from that first byte to the end of the head (request line and headers)
    write: float = 30.0  # the most a client may go without taking a byte of an answer
    workers: int = 64  # requests answered at once; more wait for a worker
    connections: int = 512  # open at once; one more is answered 503
    max_head: int = 64 * 1024  # a longer head is answered 431
    min_rate: float = 16 * 1024  # bytes/s: a file's body must be read within write + size / min_rate seconds
    bodies: int = 448  # file bodies over small_body sent at once; one more is 503 (the rest keep room for pages)
    small_body: int = 64 * 1024  # a body this small (a page, a .metadata) is sent whatever the bodies in flight


@dataclass
class Body:
    """A file body the loop thread sends: its own descriptor (a dup of the handler's), where it is, what is left."""

    fd: int
    offset: int
    left: int
    release: Callable[[], None] | None = None  # gives back the body slot it holds (PooledHTTPServer.take_body_slot)
    until: float = 0.0  # the whole body must be sent by then (time.monotonic)
    sent: int = 0  # bytes handed to the kernel
    accepted: int = 0  # of those, acknowledged by the client at the last look
    progress_at: float = 0.0  # when ``accepted`` last grew (time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        release, self.release = self.release, None
        if release is not None:
            release()


_NOTSENT_LOWAT = 128 * 1024  # unsent bytes queued per body (the kernel holds the rest back: EPOLLOUT waits for it)


def unacknowledged(sock: socket.socket) -> int | None:
    """Bytes in the socket's send queue the peer has not acknowledged (SIOCOUTQ, Linux); None where unknown."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # SIOCOUTQ is TIOCOUTQ on Linux
    except (OSError, ValueError):
        return None
    return int(struct.unpack("i", raw)[0])


@dataclass(eq=False)
class Connection:
    """One client connection between requests: what it sent so far and when it must have sent the rest."""

    sock: socket.socket
    address: tuple[str, int]
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)
    started: bool = False  # the first byte of the current request has arrived
    scanned: int = 0  # the head's end was searched for up to here
    since: float = 0.0  # when it began to wait for this request (time.monotonic)
    answered: int = 0  # requests answered on it
    body: Body | None = None  # a file body being sent
    keep: bool = False  # whether the connection stays open once the body is sent

    @property
    def kept_idle(self) -> bool:
        """A keep-alive connection between requests, nothing of the next one sent yet."""
        return self.answered > 0 and not self.started

    def head_complete(self) -> bool:
        at = _HEAD_END.search(self.buffer, max(0, self.scanned - 3))
        self.scanned = len(self.buffer)
        return at is not None


@dataclass(frozen=True)
class Request:
    """What a worker's handler reads from: the socket to answer on and the bytes read for it (its head, and any
    pipelined bytes after it, which go back to the connection)."""

    sock: socket.socket
    data: bytes


class SocketWriter(io.BufferedIOBase):
    """An unbuffered writer that sends all it is given (a timeout on the socket bounds each send)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # bytes-like, as io.BufferedIOBase.write
        self.sock.sendall(b)
        with memoryview(b) as view:
            return view.nbytes


def _raw_answer(status: str, extra: str = "") -> bytes:
    body = f"{status}\n".encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + body


class PooledHTTPServer(HTTPServer):
    """An ``HTTPServer`` whose ``serve_forever`` runs the selector loop above; ``shutdown`` and ``server_close`` as
    usual. The handler class answers exactly one request from a ``Request`` and sets ``close_connection`` and
    ``leftover`` (the bytes after its request), and may leave a file body in ``body`` (a ``Body``) for the loop
    thread to send."""

    request_queue_size = 128  # the listen backlog: a burst of connections waits there for the loop to accept it

    def __init__(self, address: tuple[str, int], handler: Callable[..., object], limits: Limits,
                 log: Callable[[str], None]) -> None:
        self.limits = limits
        self.log = log
        self._jobs: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._returned: queue.SimpleQueue[tuple[Connection, bool, Body | None]] = queue.SimpleQueue()
        self._waiting: dict[socket.socket, Connection] = {}  # waiting for a request (a head), in the selector
        self._sending: dict[socket.socket, Connection] = {}  # a file body being sent, in the selector
        self._accept_paused = 0.0  # out of file descriptors: accept again after this (time.monotonic)
        self._open = 0  # connections open, waiting or being answered: only the loop thread counts them
        self._bodies = 0  # body slots taken (workers take them, the loop gives them back)
        self._bodies_lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        super().__init__(address, handler)  # type: ignore[arg-type]  # binds and listens (server_close if it fails)

    # the loop thread

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            self._selector = selector
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            self._start_workers()
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(self._timeout(poll_interval)):
                        self._ready(key)
                    self._take_back()
                    self._expire()
                    self._resume_accepting()
            finally:
                for conn in [*self._waiting.values(), *self._sending.values()]:
                    self._close(conn)
                self._stop.clear()
                self._stopped.set()

    def _ready(self, key: selectors.SelectorKey) -> None:
        """One ready socket of a select round. A connection closed earlier in the same round (to make room) is
        skipped: its socket is gone (reading it, its descriptor is -1)."""
        if key.fileobj is self.socket:
            self._accept()
        elif key.fileobj is self._wake_r:
            self._wake_r.recv(4096)
        elif key.data.sock in self._sending:
            self._send(key.data)
        elif key.data.sock in self._waiting:
            try:
                self._read(key.data)
            except Exception as e:  # noqa: BLE001 - one connection's surprise must not end the loop
                self.log(f"{key.data.address[0]} - internal error: {type(e).__name__}: {e}")
                self._unwait(key.data)
                self._close(key.data)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        for _ in self._workers:
            self._jobs.put(None)
        while not self._returned.empty():
            conn, _, body = self._returned.get()
            conn.sock.close()
            if body is not None:
                body.close()
        self._wake_r.close()
        self._wake_w.close()

    def take_body_slot(self) -> bool:
        """A slot for one more large file body, or False when ``bodies`` are being sent (the caller answers 503);
        ``give_body_slot`` gives it back (a ``Body``'s ``release``). Called by the workers."""
        with self._bodies_lock:
            if self._bodies >= self.limits.bodies:
                return False
            self._bodies += 1
            return True

    def give_body_slot(self) -> None:
        with self._bodies_lock:
            self._bodies -= 1

    def _start_workers(self) -> None:
        while len(self._workers) < self.limits.workers:
            worker = threading.Thread(target=self._work, name=f"serve-worker-{len(self._workers)}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _timeout(self, poll_interval: float) -> float:
        if not self._waiting and not self._sending:
            return poll_interval
        soonest = min(conn.deadline for conn in [*self._waiting.values(), *self._sending.values()])
        return min(poll_interval, max(0.0, soonest - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: leave the rest in the backlog for now
                self.log(f"cannot accept a connection: {e}")
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting()  # the listening socket stays readable: do not spin on it
                return
            if self._open >= self.limits.connections and not self._make_room():
                self._refuse(sock, address)
                continue
            sock.setblocking(False)
            self._open += 1
            self._wait_for_request(Connection(sock, address, deadline=0.0))

    def _pause_accepting(self) -> None:
        self._selector.unregister(self.socket)
        self._accept_paused = time.monotonic() + 0.1

    def _resume_accepting(self) -> None:
        if self._accept_paused and time.monotonic() >= self._accept_paused:
            self._accept_paused = 0.0
            self._selector.register(self.socket, selectors.EVENT_READ)

    def _make_room(self) -> bool:
        """At the cap, close an idle keep-alive connection, else the one that has waited longest for its request
        (the slowest head: a new client's is the youngest), so that a flood of slow clients cannot lock a normal one
        out; False when every open connection is being answered or waits for a worker."""
        if not self._waiting:
            return False
        victim = min(self._waiting.values(), key=lambda c: (not c.kept_idle, c.since))
        self._unwait(victim)
        self.log(f"{victim.address[0]} - closed to make room: {self._open} connections open (at most "
                 f"{self.limits.connections}) 503")
        with contextlib.suppress(OSError):
            victim.sock.send(_raw_answer("503 Service Unavailable", "Retry-After: 1\r\n"))
        self._close(victim)
        return True

    def _refuse(self, sock: socket.socket, address: tuple[str, int]) -> None:
        """503 at once, without reading the request: the answer fits in the empty send buffer of a new socket."""
        self.log(f"{address[0]} - refused: {self._open} connections open (at most {self.limits.connections}) 503")
        try:
            sock.setblocking(False)
            sock.send(_raw_answer("503 Service Unavailable", "Retry-After: 1\r\n"))
        except OSError:
            pass
        sock.close()

    def _wait_for_request(self, conn: Connection) -> None:
        """Between requests: the next head may already be here (pipelined), else wait ``idle`` for its first byte."""
        conn.started = bool(conn.buffer)
        conn.scanned = 0
        conn.since = time.monotonic()
        conn.deadline = time.monotonic() + (self.limits.head if conn.started else self.limits.idle)
        if conn.started and self._dispatch_if_ready(conn):
            return
        self._waiting[conn.sock] = conn
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset) the connection
            self._unwait(conn)
            self._close(conn)
            return
        if not conn.started:
            conn.started = True
            conn.deadline = time.monotonic() + self.limits.head
        conn.buffer += data
        if self._dispatch_if_ready(conn, registered=True):
            return

    def _dispatch_if_ready(self, conn: Connection, registered: bool = False) -> bool:
        if not conn.head_complete() and len(conn.buffer) <= self.limits.max_head:
            return False
        if registered:
            self._unwait(conn)
        self._jobs.put(conn)
        return True

    def _unwait(self, conn: Connection) -> None:
        if self._waiting.pop(conn.sock, None) is not None or self._sending.pop(conn.sock, None) is not None:
            self._selector.unregister(conn.sock)

    def _start_body(self, conn: Connection, body: Body) -> None:
        """Send ``body`` from the loop thread as the client reads it (the worker sent the head)."""
        now = time.monotonic()
        body.until = now + self.limits.write + body.left / self.limits.min_rate
        body.progress_at = now
        conn.body, conn.deadline = body, min(body.until, now + self._look_every())
        with contextlib.suppress(OSError):  # no more than this waits unsent in the kernel (slow readers: memory)
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, _NOTSENT_LOWAT)
        self._sending[conn.sock] = conn
        self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._send(conn)

    def _send(self, conn: Connection) -> None:
        """As much of the body as the socket takes now; once it is all sent, the connection waits for its next
        request (or is closed)."""
        body = conn.body
        assert body is not None
        try:
            while body.left:
                sent = os.sendfile(conn.sock.fileno(), body.fd, body.offset, min(body.left, 1 << 20))
                if sent == 0:  # the file shrank under us: the promised length cannot be sent
                    raise OSError("the file ended early")
                body.offset += sent
                body.left -= sent
                body.sent += sent
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            self._end_body(conn)
            self._close(conn)
            return
        self._end_body(conn)
        if conn.keep and not self._stop.is_set():
            self._wait_for_request(conn)
        else:
            self._close(conn)

    def _end_body(self, conn: Connection) -> None:
        self._unwait(conn)
        if conn.body is not None:
            conn.body.close()
            conn.body = None

    def _look_every(self) -> float:
        """How often a body's progress is looked at: a stalled client is dropped within 7/6 ``write``."""
        return self.limits.write / 6

    def _progressed(self, conn: Connection, now: float) -> bool:
        """Whether the client has acknowledged bytes of its body within the last ``write`` seconds (the look is at
        the kernel's send queue: what the client's side took, however seldom the socket turns writable)."""
        body = conn.body
        assert body is not None
        queued = unacknowledged(conn.sock)
        accepted = body.sent - queued if queued is not None else body.sent
        if accepted > body.accepted:
            body.accepted, body.progress_at = accepted, now
        return now - body.progress_at < self.limits.write

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._sending.values() if c.deadline <= now]:
            assert conn.body is not None
            if conn.body.until <= now:
                self.log(f"{conn.address[0]} - answer not sent within {conn.body.until - conn.since:.0f} s (read "
                         f"slower than {self.limits.min_rate:.0f} bytes/s): closed")
            elif self._progressed(conn, now):
                conn.deadline = min(conn.body.until, now + self._look_every())
                continue
            else:
                self.log(f"{conn.address[0]} - client read nothing for {self.limits.write:g} s: closed")
            self._end_body(conn)
            self._close(conn, abort=True)
        for conn in [c for c in self._waiting.values() if c.deadline <= now]:
            self._unwait(conn)
            if conn.started:  # a head begun and not finished in time: say so, then close
                self.log(f"{conn.address[0]} - request head not complete within {self.limits.head:g} s: 408, closed")
                try:
                    conn.sock.send(_raw_answer("408 Request Timeout"))
                except OSError:
                    pass
            self._close(conn)

    def _take_back(self) -> None:
        while not self._returned.empty():
            conn, keep, body = self._returned.get()
            conn.answered += 1
            if body is not None and not self._stop.is_set():
                conn.sock.setblocking(False)
                conn.keep, conn.since = keep, time.monotonic()
                self._start_body(conn, body)
            elif body is not None:
                body.close()
                self._close(conn)
            elif keep and not self._stop.is_set():
                conn.sock.setblocking(False)
                self._wait_for_request(conn)
            else:
                self._close(conn)

    def _close(self, conn: Connection, *, abort: bool = False) -> None:
        """Close the connection; ``abort``: with a reset, dropping what the kernel still holds to send (a dropped
        slow reader would otherwise go on reading the send buffer's megabytes)."""
        self._open -= 1
        try:
            if abort:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        conn.sock.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (the loop wakes anyway) or closed
            pass

    # the worker threads

    def _work(self) -> None:
        while (conn := self._jobs.get()) is not None:
            body: list[Body] = []
            keep = self._answer(conn, body)
            self._returned.put((conn, keep, body[0] if body else None))
            self._wake()

    def _answer(self, conn: Connection, body: list[Body]) -> bool:
        """Answer the one request in ``conn.buffer``; whether the connection stays open for the next. A file body
        the handler leaves (``handler.body_out``) goes into ``body``, for the loop thread to send."""
        try:
            conn.sock.settimeout(self.limits.write)
            if _HEAD_END.search(conn.buffer) is None:
                self.log(f"{conn.address[0]} - request head over {self.limits.max_head} bytes: 431, closed")
                conn.sock.sendall(_raw_answer("431 Request Header Fields Too Large"))
                return False
            handler = self.RequestHandlerClass(Request(conn.sock, bytes(conn.buffer)), conn.address,
                                               self)  # type: ignore[arg-type]  # typeshed's Self
            conn.buffer = bytearray(getattr(handler, "leftover", b""))
            if (left := getattr(handler, "body_out", None)) is not None:
                body.append(left)
            return not getattr(handler, "close_connection", True)
        except OSError as e:  # the client went away or stopped reading: nothing to answer to
            if isinstance(e, TimeoutError):
                self.log(f"{conn.address[0]} - client read nothing for {self.limits.write:g} s: closed")
            return False
        except Exception as e:  # noqa: BLE001 - a bug in a handler must not kill the worker
            self.log(f"{conn.address[0]} - internal error: {type(e).__name__}: {e}")
            return False
