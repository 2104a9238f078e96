"""`builder serve` keeps honest slow readers and room for new clients (issue 54 item 4). Real servers on 127.0.0.1,
real sockets; the timings that matter for users are in bench/serve_clients.py, these only check the behaviour."""

from __future__ import annotations

import contextlib
import socket
import time

from builder.index.connections import Limits
from builder.index.pages import SIMPLE_JSON
from builder.index.store import Wheelhouse
from tests.test_serve import get
from tests.test_serve_limits import connect, house, read_until_closed, serving  # noqa: F401  (house: a fixture)

BIG = b"GET /wheels/big.whl HTTP/1.1\r\nHost: x\r\n\r\n"


def _big_file(house: Wheelhouse, size: int) -> None:  # noqa: F811
    with open(house.wheels / "big.whl", "wb") as f:
        f.truncate(size)


def _read_steadily(sock: socket.socket, rate: float, seconds: float) -> tuple[int, bool]:
    """Read at ``rate`` bytes/s for ``seconds``; (bytes read, whether the server cut the connection)."""
    started, got = time.monotonic(), 0
    sock.settimeout(0.05)
    while (now := time.monotonic()) - started < seconds:
        want = int((now - started) * rate) - got
        if want > 0:
            try:
                chunk = sock.recv(want)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return got, True
            if not chunk:
                return got, True
            got += len(chunk)
        time.sleep(0.01)
    return got, False


def test_a_steady_reader_is_kept_however_seldom_the_socket_turns_writable(house: Wheelhouse) -> None:  # noqa: F811
    """Issue 54: progress was the returns of sendfile, which come only once the client has drained a third of a send
    buffer that grows to MiBs; a client reading steadily (here 1 MiB/s with a 0.4 s write deadline, the shape of
    20 KiB/s against 30 s) was reset as "read nothing". Progress is now what the client acknowledged."""
    _big_file(house, 64 << 20)
    limits = Limits(write=0.4, min_rate=1 << 20)
    with serving(house.root, limits) as (url, log), connect(url) as sock:
        sock.sendall(BIG)
        got, cut = _read_steadily(sock, 1 << 20, 1.2)
    assert not cut, f"cut after {got} bytes: {log.getvalue()}"
    assert got > 900 << 10
    assert "read nothing" not in log.getvalue()


def test_a_reader_that_stops_is_still_dropped(house: Wheelhouse) -> None:  # noqa: F811
    """Looking at acknowledged bytes must not keep a stalled client: it is reset within about 7/6 of ``write``."""
    _big_file(house, 64 << 20)
    with serving(house.root, Limits(write=0.3)) as (url, log), connect(url) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(BIG)
        sock.recv(65536)  # some progress, then nothing
        started = time.monotonic()
        while "read nothing" not in log.getvalue() and time.monotonic() - started < 3:
            time.sleep(0.02)
        took = time.monotonic() - started
    assert "client read nothing for 0.3 s: closed" in log.getvalue()
    assert took < 1.0, took


def test_downloads_leave_room_for_new_clients(house: Wheelhouse) -> None:  # noqa: F811
    """Issue 54: 520 downloads held all 512 connections and a new client got only 503. Here 10 connections, 8 body
    slots: 12 clients ask for a large file; 8 get it, the others a 503 with Retry-After (closed), and a new client
    still reads a page and a small file. A finished download's slot is given back."""
    _big_file(house, 16 << 20)
    small = next(house.wheels.glob("demo-*.whl")).name
    with serving(house.root, Limits(connections=10, bodies=8, small_body=1 << 20)) as (url, log):
        downloads = []
        try:
            for _ in range(12):
                sock = connect(url)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(BIG)
                downloads.append(sock)
            time.sleep(0.3)
            heads = []
            for sock in downloads:
                sock.settimeout(2)
                heads.append(sock.recv(4096))
            assert sum(h.startswith(b"HTTP/1.1 200 ") for h in heads) == 8, heads
            refused = [s for s, h in zip(downloads, heads, strict=True) if h.startswith(b"HTTP/1.1 503 ")]
            assert len(refused) == 4 and all(b"Retry-After: 1" in h for h in heads if h.startswith(b"HTTP/1.1 503"))
            for sock in refused:
                read_until_closed(sock)  # closed by the server (else a timeout)
            started = time.monotonic()
            status, _, body = get(url + "simple/demo/", SIMPLE_JSON)
            assert status == 200 and b'"name": "demo"' in body
            assert get(url + f"wheels/{small}")[0] == 200
            assert time.monotonic() - started < 1
            for sock in downloads[:8]:  # the downloads end: their slots come back
                sock.close()
            time.sleep(0.3)
            with connect(url) as sock:
                sock.sendall(BIG)
                sock.settimeout(2)
                assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in downloads:
                with contextlib.suppress(OSError):
                    sock.close()
    assert '"GET /wheels/big.whl HTTP/1.1" 503' in log.getvalue()
