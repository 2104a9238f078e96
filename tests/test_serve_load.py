"""`builder serve` under load (issue 40, item 1): a flood of slow connections past the cap, slow readers of large
files, a Range header built to make a regex backtrack. Real `builder serve` servers on 127.0.0.1, real sockets."""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from builder.index.connections import Limits
from builder.index.httpheaders import UNSATISFIABLE, byte_range
from builder.index.pages import SIMPLE_JSON
from builder.index.store import Wheelhouse
from tests.test_serve import get
from tests.test_serve_limits import connect, house, serving  # noqa: F401  (house: a fixture)

HOSTILE_RANGE = "bytes=" + " " * 6400 + "-" + " " * 6400 + "x"  # 12.8 KB: the header


def test_a_12kb_range_header_is_parsed_at_once() -> None:
    """The Range regex (``\\s*`` on both sides of optional digits) backtracked cubically: 5.7 s for 1.6 KB."""
    started = time.monotonic()
    assert byte_range(HOSTILE_RANGE, 100) is None
    assert byte_range("bytes=" + "9" * 12800 + "-", 100) == UNSATISFIABLE
    assert byte_range("bytes=" + " " * 12800 + "5-6" + " " * 12800, 100) == (5, 6)
    assert byte_range("bytes=" + "0" * 12800 + "5-" + "0" * 12800 + "6", 100) == (5, 6)
    assert time.monotonic() - started < 0.5


def test_a_12kb_range_header_is_answered(house: Wheelhouse) -> None:  # noqa: F811
    wheel = next(house.wheels.glob("*.whl"))
    with serving(house.root) as (url, _), connect(url) as sock:
        sock.sendall(f"GET /wheels/{wheel.name.replace('+', '%2B')} HTTP/1.1\r\nHost: x\r\nRange: {HOSTILE_RANGE}"
                     "\r\nConnection: close\r\n\r\n".encode())
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


@contextlib.contextmanager
def slow_clients(url: str, count: int, request: bytes) -> Iterator[list[socket.socket]]:
    """``count`` connections that each sent the start of ``request`` (a head never finished, or a whole request
    whose answer they read slowly); closed on exit."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                sock = connect(url)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(request)
                held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


def fast_client_latencies(url: str, rounds: int, pause_s: float) -> list[float]:
    took = []
    for _ in range(rounds):
        started = time.monotonic()
        status, _, body = get(url + "simple/demo/", SIMPLE_JSON)
        took.append(time.monotonic() - started)
        assert status == 200 and b'"name": "demo"' in body
        time.sleep(pause_s)
    return took


def server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("serve-worker"))


def test_a_flood_past_the_cap_does_not_stop_the_server(house: Wheelhouse) -> None:  # noqa: F811
    """Issue 40: past the cap, making room closed a connection that the same round of the loop then read, and
    ``unregister`` of its closed socket raised ``Invalid file descriptor: -1``, which ended the loop: every later
    client hung. For 2 s, new connections against a cap of 20 while every open one keeps sending bytes."""
    with serving(house.root, Limits(connections=20, idle=30, head=30)) as (url, log):
        held: list[socket.socket] = []
        stop = time.monotonic() + 2

        def drip() -> None:
            while time.monotonic() < stop:
                for sock in list(held):
                    with contextlib.suppress(OSError):
                        sock.send(b"x")
                time.sleep(0.001)

        dripper = threading.Thread(target=drip)
        dripper.start()
        try:
            while time.monotonic() < stop:
                with contextlib.suppress(OSError):
                    held.append(connect(url))
            dripper.join()
            assert len(held) > 20
            assert fast_client_latencies(url, 3, 0.0)
        finally:
            dripper.join()
            for sock in held:
                sock.close()
        assert "closed to make room" in log.getvalue()


def test_slow_readers_do_not_hold_the_workers(house: Wheelhouse) -> None:  # noqa: F811
    """Issue 40: 200 clients reading a large file slowly (never stalled long enough for the write timeout) held every
    worker, so a normal request waited without end. 20 slow readers, 4 workers: the bodies are sent by the
    connection loop, so a normal request is answered at once."""
    big = house.wheels / "big.whl"
    with open(big, "wb") as f:
        f.truncate(16 << 20)
    with serving(house.root, Limits(workers=4, write=5)) as (url, _):
        with slow_clients(url, 20, b"GET /wheels/big.whl HTTP/1.1\r\nHost: x\r\n\r\n") as readers:
            time.sleep(0.3)
            for sock in readers:
                sock.recv(1024)  # reading: progress, so no write ever waits 5 s
            took = fast_client_latencies(url, 5, 0.05)
            assert max(took) < 1.0, took


def test_a_slow_reader_is_cut_at_the_minimum_rate(house: Wheelhouse) -> None:  # noqa: F811
    """A reader slower than ``min_rate`` that keeps reading (so no write ever waits ``write`` seconds) is dropped, with
    a reset, when its answer's time is up: ``write`` + size / ``min_rate`` = 1 + 32 MiB / 32 MiB/s = 2 s; this
    reader takes at most 64 KiB per 10 ms (6.4 MB/s, 5 s for the file)."""
    big = house.wheels / "big.whl"
    with open(big, "wb") as f:
        f.truncate(32 << 20)
    with serving(house.root, Limits(write=1, min_rate=32 << 20)) as (url, log), connect(url) as sock:
        sock.sendall(b"GET /wheels/big.whl HTTP/1.1\r\nHost: x\r\n\r\n")
        started, got = time.monotonic(), 0
        with contextlib.suppress(ConnectionResetError):
            while (chunk := sock.recv(65536)) and time.monotonic() - started < 10:
                got += len(chunk)
                time.sleep(0.01)
        took = time.monotonic() - started
    assert 1.5 < took < 4.5, took
    assert got < 32 << 20
    assert "answer not sent within 2 s (read slower than 33554432 bytes/s): closed" in log.getvalue()


def test_1000_slow_clients_and_a_fast_one(house: Wheelhouse) -> None:  # noqa: F811
    """The issue's load: 1000 slow clients (800 dripping heads, 200 reading a 4 MiB file slowly) against the default
    limits (512 connections, 64 workers); a fast client keeps getting answers, the server keeps its 64 workers."""
    big = house.wheels / "big.whl"
    with open(big, "wb") as f:
        f.truncate(4 << 20)
    with serving(house.root, Limits()) as (url, log):
        with slow_clients(url, 200, b"GET /wheels/big.whl HTTP/1.1\r\nHost: x\r\n\r\n") as readers, \
                slow_clients(url, 800, b"GET /simple/ HTTP/1.1\r\nX-Drip: ") as drippers:
            took = []
            for _ in range(10):
                for sock in readers[::10]:
                    with contextlib.suppress(OSError):
                        sock.recv(512)
                took += fast_client_latencies(url, 1, 0.1)
            open_now = sum(1 for s in drippers + readers if _still_open(s))
        assert max(took) < 2.0, took
        assert server_threads() == 64
        print(f"\n1000 slow clients: {open_now} held open by the server; fast client median "
              f"{statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms over {len(took)} requests")
        assert 400 <= open_now <= 512


def _still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed this connection (nothing to read but it is not at its end)."""
    try:
        sock.setblocking(False)
        data = sock.recv(1 << 20, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return bool(data) and not data.startswith(b"HTTP/1.1 503")


@pytest.mark.parametrize("header", ["bytes=0-9", " bytes = 5 - 6 ", "BYTES=-5"])
def test_ranges_still_work(header: str) -> None:
    assert byte_range(header, 100) in ((0, 9), (5, 6), (95, 99))
