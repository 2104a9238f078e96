"""`builder serve` against hostile or clumsy clients and files (issue 30, item 6): links that leave the wheelhouse,
slow-drip and idle connections, too many connections, and `Range` requests. Localhost sockets only."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.index.connections import Limits
from builder.index.httpheaders import UNSATISFIABLE, byte_range
from builder.index.pages import SIMPLE_JSON
from builder.index.serve import base_url, make_server
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.test_index import labelled_wheel
from tests.test_serve import get


@contextlib.contextmanager
def serving(root: Path, limits: Limits | None = None) -> Iterator[tuple[str, io.StringIO]]:
    log = io.StringIO()
    server = make_server(root, "127.0.0.1", 0, log_stream=log, limits=limits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield base_url(server), log
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def house(tmp_path: Path) -> Wheelhouse:
    house = Wheelhouse(tmp_path / "wh")
    house.publish(labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14"), BuildRecord.from_json({}))
    return house


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


# links and odd files


def test_a_hard_link_is_not_served(house: Wheelhouse, tmp_path: Path) -> None:
    """Issue 30 item 6: a hard link inside the wheelhouse to a file outside (there /etc/passwd) was served."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:outside\n")
    os.link(secret, house.wheels / "passwd.whl")
    with serving(house.root) as (url, log):
        status, _, body = get(url + "wheels/passwd.whl")
        assert status == 404 and b"outside" not in body
        status, _, listing = get(url + "wheels/")
        assert status == 200 and b"passwd" not in listing and b"demo-1.0" in listing
        assert "refused wheels/passwd.whl: 2 hard links to it" in log.getvalue()


def test_a_fifo_is_not_opened(house: Wheelhouse) -> None:
    """Opening a fifo for reading would wait for a writer and hold a worker forever."""
    os.mkfifo(house.wheels / "pipe.whl")
    with serving(house.root) as (url, log):
        started = time.monotonic()
        assert get(url + "wheels/pipe.whl")[0] == 404
        assert time.monotonic() - started < 2
        assert "refused wheels/pipe.whl: not a regular file" in log.getvalue()


def test_page_generations_behind_symlinks_are_served(tmp_path: Path) -> None:
    """Atomic publication reaches the pages through links into hidden generation folders (builder/index/layout.py):
    ``simple -> .generations/current/simple``, ``.generations/current -> N``, the same under staging/. A link whose
    real path stays in a generation is served; one that leads to the lock, a temp file or out of the wheelhouse is
    not, and a URL never names the hidden folder itself."""
    root = tmp_path / "wh"
    for base in (root, root / "staging"):
        page = base / ".generations" / "12" / "simple" / "demo"
        page.mkdir(parents=True)
        (page / "index.html").write_text("<!DOCTYPE html><html>demo</html>\n")
        (page / "index.json").write_text('{"name": "demo"}\n')
        (base / ".generations" / "current").symlink_to("12")
        (base / "simple").symlink_to(Path(".generations/current/simple"))
        temp = base / ".generations" / ".current.0a1b2c3d.builder-tmp"
        temp.mkdir()
        (temp / "half.whl").write_text("half-written")
    (root / ".publish.lock").write_text("lock")
    (root / ".generations" / "x1").mkdir()
    (root / ".generations" / "x1" / "a.whl").write_text("not a generation")
    wheels = root / "wheels"
    wheels.mkdir()
    for name, target in (("lock.whl", "../.publish.lock"), ("half.whl", "../.generations/.current.0a1b2c3d.builder-tmp/"
                         "half.whl"), ("odd.whl", "../.generations/x1/a.whl"), ("up.whl", "../../outside.whl")):
        (wheels / name).symlink_to(target)
    (tmp_path / "outside.whl").write_text("outside")
    with serving(root) as (url, _):
        for prefix in ("", "staging/"):
            status, headers, body = get(url + prefix + "simple/demo/", SIMPLE_JSON)
            assert (status, headers["content-type"], body) == (200, SIMPLE_JSON, b'{"name": "demo"}\n'), prefix
            assert get(url + prefix + "simple/demo/")[0] == 200
        assert get(url + ".generations/12/simple/demo/index.json")[0] == 404
        for name in ("lock.whl", "half.whl", "odd.whl", "up.whl"):
            assert get(url + "wheels/" + name)[0] == 404, name
        status, _, listing = get(url + "wheels/")
        assert status == 200 and b".whl" not in listing


# Range


def test_byte_range() -> None:
    assert byte_range(None, 100) is None
    assert byte_range("bytes=0-9", 100) == (0, 9)
    assert byte_range("bytes=90-", 100) == (90, 99)
    assert byte_range("bytes=-10", 100) == (90, 99)
    assert byte_range("bytes=-1000", 100) == (0, 99)
    assert byte_range("bytes=50-1000", 100) == (50, 99)
    assert byte_range(" bytes = 5 - 6 ", 100) == (5, 6)
    assert byte_range("bytes=100-", 100) == UNSATISFIABLE
    assert byte_range("bytes=-0", 100) == UNSATISFIABLE
    assert byte_range("bytes=0-0", 0) == UNSATISFIABLE
    for ignored in ("bytes=0-1,5-6", "bytes=5-3", "items=0-1", "bytes=", "bytes=-", "bytes=a-b", "bytes=²-"):
        assert byte_range(ignored, 100) is None, ignored


def ranged(url: str, value: str | None, method: str = "GET", if_range: str | None = None,
           ) -> tuple[int, dict[str, str], bytes]:
    import http.client

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    headers = {**({"Range": value} if value else {}), **({"If-Range": if_range} if if_range else {})}
    conn.request(method, parts.path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def test_range_requests_on_a_wheel(house: Wheelhouse) -> None:
    wheel = next(house.wheels.glob("*.whl"))
    data = wheel.read_bytes()
    size = len(data)
    with serving(house.root) as (url, _):
        whl = url + "wheels/" + wheel.name.replace("+", "%2B")
        status, headers, body = ranged(whl, None)
        assert (status, headers["accept-ranges"], body) == (200, "bytes", data)
        for value, first, last in (("bytes=0-9", 0, 9), ("bytes=10-", 10, size - 1), ("bytes=-5", size - 5, size - 1),
                                   (f"bytes=100-{size * 2}", 100, size - 1)):
            status, headers, body = ranged(whl, value)
            assert status == 206, value
            assert headers["content-range"] == f"bytes {first}-{last}/{size}"
            assert int(headers["content-length"]) == last - first + 1 and body == data[first:last + 1], value
        for value in (f"bytes={size}-", "bytes=-0"):
            status, headers, body = ranged(whl, value)
            assert (status, headers["content-range"], body) == (416, f"bytes */{size}", b""), value
        assert ranged(whl, "bytes=0-1,5-6")[::2] == (200, data), "several ranges: the whole file"
        status, headers, _ = ranged(whl, "bytes=0-9", if_range="Wed, 01 Jan 2020 00:00:00 GMT")
        assert status == 200, "If-Range for another version of the file: the whole file"
        status, headers, body = ranged(whl, "bytes=0-9", if_range=ranged(whl, None)[1]["last-modified"])
        assert status == 206 and body == data[:10]
        status, headers, body = ranged(whl, "bytes=0-9", method="HEAD")
        assert (status, headers["content-length"], body) == (206, "10", b"")


def test_a_resumed_download_completes(house: Wheelhouse) -> None:
    """What pip does after a broken download: the rest from where it stopped, on the same keep-alive connection."""
    import http.client

    wheel = next(house.wheels.glob("*.whl"))
    data = wheel.read_bytes()
    with serving(house.root) as (url, _):
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        path = "/wheels/" + wheel.name.replace("+", "%2B")
        got = b""
        while len(got) < len(data):
            conn.request("GET", path, headers={"Range": f"bytes={len(got)}-{len(got) + 99}"})
            response = conn.getresponse()
            assert response.status == 206
            got += response.read()
        conn.close()
    assert got == data


# connections


def test_a_slow_drip_head_is_dropped(house: Wheelhouse) -> None:
    """Issue 30 item 6: one header byte a second held a server socket (and thread) open without end."""
    limits = Limits(idle=0.5, head=1.0)
    with serving(house.root, limits) as (url, log), connect(url) as sock:
        request = b"GET /simple/ HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100
        started = time.monotonic()
        answer = b""
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with contextlib.suppress(OSError):
            answer = read_until_closed(sock)
        took = time.monotonic() - started
        assert 0.9 < took < 3.0, took
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
        assert "request head not complete within 1 s: 408, closed" in log.getvalue()


def test_idle_connections_are_closed(house: Wheelhouse) -> None:
    """A new connection that says nothing, and a keep-alive one after its answer, are closed after ``idle``."""
    with serving(house.root, Limits(idle=0.5)) as (url, _):
        with connect(url) as sock:
            started = time.monotonic()
            assert read_until_closed(sock) == b""
            assert 0.4 < time.monotonic() - started < 2.5
        with connect(url) as sock:
            sock.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n")
            started = time.monotonic()
            answer = read_until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"</html>\n")
            assert 0.4 < time.monotonic() - started < 2.5


def test_slow_clients_do_not_starve_a_normal_one(house: Wheelhouse) -> None:
    """200 slow-drip clients and only 4 workers: reading heads costs no worker, so a normal request is answered at
    once (a thread per connection, or a worker held while a head drips in, would leave it waiting)."""
    with serving(house.root, Limits(idle=20, head=20, workers=4)) as (url, _):
        slow = [connect(url) for _ in range(200)]
        try:
            for _ in range(3):
                for sock in slow:
                    sock.sendall(b"G")
                time.sleep(0.2)
            for _ in range(5):
                started = time.monotonic()
                status, _, body = get(url + "simple/demo/", SIMPLE_JSON)
                took = time.monotonic() - started
                assert status == 200 and b'"name": "demo"' in body
                assert took < 1.0, f"a normal request took {took:.2f} s beside 200 slow clients"
        finally:
            for sock in slow:
                sock.close()


def test_at_the_cap_a_waiting_connection_makes_room(house: Wheelhouse) -> None:
    """At the cap (3), a new connection closes (503) an idle keep-alive one, else the one waiting longest for its
    request, never itself: a flood of slow or idle clients cannot lock a normal client out."""
    with serving(house.root, Limits(connections=3)) as (url, log):
        held = []
        for _ in range(3):
            held.append(connect(url))
            time.sleep(0.1)  # accepted in this order
        held[2].sendall(b"GET /simple/ HT")  # a slow head
        try:
            assert get(url + "simple/")[0] == 200
            assert read_until_closed(held[0]).startswith(b"HTTP/1.1 503 "), "the oldest made room"
            assert "closed to make room: 3 connections open (at most 3) 503" in log.getvalue()
            time.sleep(0.3)  # the server saw that client leave: held[1], held[2] open
            kept = connect(url)
            kept.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.2)  # answered and kept alive: held[1], held[2], kept (the cap)
            assert get(url + "simple/")[0] == 200
            assert b"503 Service Unavailable" in read_until_closed(kept), "an idle keep-alive one goes first"
            time.sleep(0.3)
            young = connect(url)  # held[1] (older), held[2], young: the cap
            time.sleep(0.1)
            assert get(url + "simple/")[0] == 200
            assert b"Retry-After: 1" in read_until_closed(held[1])
            young.settimeout(0.3)
            with pytest.raises(TimeoutError):
                young.recv(1)  # still open
            young.close()
        finally:
            for sock in held:
                sock.close()


def _ask_for_a_big_file_and_never_read(house: Wheelhouse, sock: socket.socket, settle_s: float) -> None:
    """A 64 MiB file in the wheelhouse, asked for on ``sock`` with a small receive buffer that is never read."""
    with open(house.wheels / "big.whl", "wb") as f:
        f.truncate(64 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /wheels/big.whl HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(settle_s)


def test_past_the_cap_with_every_connection_busy_503(house: Wheelhouse) -> None:
    """When every open connection is being answered (here: one client that never reads a large file), a new one is
    answered 503 at once."""
    with serving(house.root, Limits(connections=1, write=5)) as (url, log), connect(url) as stuck:
        _ask_for_a_big_file_and_never_read(house, stuck, 0.3)
        started = time.monotonic()
        with connect(url) as extra:
            answer = read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        assert time.monotonic() - started < 1
        assert "refused: 1 connections open (at most 1) 503" in log.getvalue()


def test_pipelined_requests_and_bodies(house: Wheelhouse) -> None:
    with serving(house.root) as (url, _):
        with connect(url) as sock:
            sock.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\nHEAD /simple/demo/ HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\n\r\n")
            answer = read_until_closed(sock)
        assert answer.count(b"HTTP/1.1 200 ") == 2
        with connect(url) as sock:  # a body is not read: the connection closes after the answer
            sock.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1


def test_an_oversized_head_gets_431(house: Wheelhouse) -> None:
    with serving(house.root, Limits(max_head=1024)) as (url, _), connect(url) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 2000)
        assert read_until_closed(sock).startswith(b"HTTP/1.1 431 ")


def test_a_client_that_stops_reading_frees_its_worker(house: Wheelhouse) -> None:
    """With one worker, a client that asks for a large file and never reads it holds that worker only until a write
    has waited ``write`` seconds."""
    with serving(house.root, Limits(write=0.5, workers=1)) as (url, log), connect(url) as stuck:
        _ask_for_a_big_file_and_never_read(house, stuck, 0.2)
        started = time.monotonic()
        assert get(url + "simple/")[0] == 200
        assert time.monotonic() - started < 3
        time.sleep(1)
        assert "client read nothing for 0.5 s: closed" in log.getvalue()


def test_a_badly_named_wheel_dropped_into_wheels_is_in_no_channel() -> None:
    """`builder serve` listed the channels through every wheel's name; a `junk.whl` copied in by hand raised
    InvalidWheelFilename at startup (a traceback). Publish and `index rebuild` refuse such a file; it has no channel."""
    from builder.index.channelpolicy import wheel_channels

    assert wheel_channels("junk.whl", None) == ()
    assert wheel_channels("demo-1.0+cu130torch2.14-py3-none-any.whl", None) == ("cu130torch2.14",)
