"""`builder serve`: the wheelhouse over HTTP with PEP 691 content negotiation."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.index.httpheaders import negotiate
from builder.index.pages import SIMPLE_HTML, SIMPLE_JSON
from builder.index.serve import base_url, make_server
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.test_index import labelled_wheel


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "text/html"),
        ("", "text/html"),
        ("*/*", "text/html"),
        ("text/html", "text/html"),
        (SIMPLE_JSON, SIMPLE_JSON),
        ("application/vnd.pypi.simple.latest+json", SIMPLE_JSON),
        (SIMPLE_HTML, SIMPLE_HTML),
        # what uv and pip send
        (f"{SIMPLE_JSON}, {SIMPLE_HTML};q=0.2, text/html;q=0.01", SIMPLE_JSON),
        (f"{SIMPLE_JSON}, {SIMPLE_HTML}; q=0.1, text/html; q=0.01", SIMPLE_JSON),
        (f"{SIMPLE_JSON};q=0.5, {SIMPLE_HTML}", SIMPLE_HTML),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "text/html"),  # a browser
        (f"{SIMPLE_JSON};q=0", None),
        ("application/xml", None),
        ("application/vnd.pypi.simple.v2+json", None),
    ],
)
def test_negotiate(accept: str | None, expected: str | None) -> None:
    assert negotiate(accept) == expected


def test_format_query_parameter_wins() -> None:
    assert negotiate("text/html", SIMPLE_JSON) == SIMPLE_JSON


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Wheelhouse, str, io.StringIO]]:
    tmp = tmp_path_factory.mktemp("serve")
    house = Wheelhouse(tmp / "wh")
    for label in ("cu130torch2.14", "cu128torch2.10"):
        house.publish(labelled_wheel(tmp, "Demo_Pkg", "1.0", label), BuildRecord.from_json({}))
    (house.root / ".secret-temp").write_text("never served")
    log = io.StringIO()
    server = make_server(house.root, "127.0.0.1", 0, log_stream=log)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield house, base_url(server), log
    server.shutdown()
    server.server_close()


def get(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    parts = http.client.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    conn.request(method, path, headers={"Accept": accept} if accept is not None else {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def test_content_negotiation_on_every_index_page(served: tuple[Wheelhouse, str, io.StringIO]) -> None:
    house, url, _ = served
    for page in ("simple/", "simple/demo-pkg/", "channels/cu128torch2.10/simple/demo-pkg/"):
        status, headers, body = get(url + page, SIMPLE_JSON)
        assert status == 200 and headers["content-type"] == SIMPLE_JSON and headers["vary"] == "Accept"
        data = json.loads(body)
        assert data["meta"]["api-version"] == "1.1"
        status, headers, body = get(url + page, SIMPLE_HTML)
        assert (status, headers["content-type"], headers["vary"]) == (200, SIMPLE_HTML, "Accept")
        assert body.startswith(b"<!DOCTYPE html>")
        status, headers, body = get(url + page)  # no Accept: HTML, as a plain web server would
        assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
        status, headers, body = get(url + page + "?format=" + SIMPLE_JSON, "text/html")
        assert headers["content-type"] == SIMPLE_JSON
        status, headers, body = get(url + page, "application/xml")
        assert status == 406 and b"application/vnd.pypi.simple.v1+json" in body
    status, _, body = get(url + "channels/cu128torch2.10/simple/demo-pkg/", SIMPLE_JSON)
    assert [f["filename"] for f in json.loads(body)["files"]] == ["Demo_Pkg-1.0+cu128torch2.10-py3-none-any.whl"]


def test_files_redirects_and_hidden(served: tuple[Wheelhouse, str, io.StringIO]) -> None:
    house, url, log = served
    name = "Demo_Pkg-1.0+cu130torch2.14-py3-none-any.whl"
    status, headers, body = get(url + "wheels/" + name.replace("+", "%2B"))
    assert status == 200 and hashlib.sha256(body).digest() == hashlib.sha256((house.wheels / name).read_bytes()).digest(), \
        "the served wheel differs"
    assert headers["content-type"] == "application/octet-stream"
    status, _, body = get(url + f"wheels/{name}.metadata")
    assert status == 200 and body == (house.wheels / f"{name}.metadata").read_bytes(), "the sidecar differs"
    status, headers, _ = get(url + "simple/Demo_Pkg/", SIMPLE_JSON)
    assert status == 301 and headers["location"] == "/simple/demo-pkg/", "PEP 503: normalized names"
    status, headers, _ = get(url + "simple/demo-pkg")
    assert status == 301 and headers["location"].endswith("/simple/demo-pkg/")
    assert get(url + ".publish.lock")[0] == 404 and get(url + ".secret-temp")[0] == 404
    assert get(url + "simple/../.secret-temp")[0] == 404
    status, _, body = get(url + "wheels/")
    assert status == 200 and name.encode() in body and b".secret" not in body
    status, headers, body = get(url)
    assert status == 200 and b"<h1>Wheelhouse</h1>" in body, "the dashboard is the front page"
    assert get(url + "simple/demo-pkg/", SIMPLE_JSON, method="HEAD")[0] == 200
    assert '"GET /simple/demo-pkg/ HTTP/1.1" 200' in log.getvalue()


def test_builder_serve_command(tmp_path: Path) -> None:
    """The real CLI: binds 127.0.0.1 by default, --port 0 picks a port, prints the URL, answers, stops on SIGINT."""
    house = Wheelhouse(tmp_path / "wh")
    house.publish(labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14"), BuildRecord.from_json({}))
    env = {**os.environ, "COLUMNS": "300"}
    # as from a terminal: a process started with SIGINT ignored (a background job of a script, nohup) keeps it so
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house.root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {house.root} at http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        # the URLs to give a resolver are the channels; the combined simple/ is not advertised (it can swap torch)
        assert proc.stdout.readline() == f"  channel cu130torch2.14: {url}channels/cu130torch2.14/simple/\n"
        assert "simple/" not in line
        status, headers, body = get(url + "simple/demo/", SIMPLE_JSON)
        assert status == 200 and json.loads(body)["name"] == "demo"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    assert '"GET /simple/demo/ HTTP/1.1" 200' in proc.stderr.read()


def test_sigterm_unwinds_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (a cancelled CI job, `timeout`) goes through the same cleanup as Ctrl-C instead of killing the
    builder outright (which would leave child process groups such as kernel-test workers running): the long-running
    `serve` command stops through the interrupt path (0 from serve's own handler, or 130 from the CLI's, depending
    on where the signal lands) rather than dying by the signal (-15)."""
    house = Wheelhouse(tmp_path / "wh")
    house.publish(labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14"), BuildRecord.from_json({}))
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house.root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().startswith("serving ")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) in (0, 130), proc.stderr.read()


def test_builder_serve_errors(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("serve", "--wheelhouse", str(tmp_path / "nothing"), "--port", "0"),
                          "no index in", "builder index rebuild")
    house = Wheelhouse(tmp_path / "wh")
    house.publish(labelled_wheel(tmp_path, "demo", "1.0", None), BuildRecord.from_json({}))
    server = make_server(house.root, "127.0.0.1", 0)
    try:
        port = str(server.server_address[1])
        result = run_cli("serve", "--wheelhouse", str(house.root), "--port", port)
        assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "--port")
    finally:
        server.server_close()


def raw_request(url: str, request_line: str) -> bytes:
    """Send one raw request line and read the answer (the connection must not just drop)."""
    import socket

    parts = http.client.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(f"{request_line}\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(("path", "status"), [
    ("/simple/%00", 400),
    ("/simple/demo-pkg/%00/", 400),
    ("/wheels/x%00.whl", 400),
    ("/" + "a/" * 4000, 414),  # issue 17 case 9: 8 KB of segments
    ("/" + "a" * 300 + "/", 414),
    ("/" + "a/" * 1500, 404),  # under the limits, longer than PATH_MAX with the root in front
    ("/simple/../../../../etc/passwd", 404),
    ("/%2e%2e/%2e%2e/etc/passwd", 404),
    ("/simple/%ff%fe/", 404),
])
def test_every_request_is_answered(served: tuple[Wheelhouse, str, io.StringIO], path: str, status: int) -> None:
    _, url, _ = served
    answer = raw_request(url, f"GET {path} HTTP/1.1")
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()) or answer.startswith(f"HTTP/1.0 {status} ".encode()), \
        answer[:200]


def test_symlinks_out_of_the_wheelhouse_are_not_served(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    name = house.publish(labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14"), BuildRecord.from_json({})).name
    secret = tmp_path / "secret.txt"
    secret.write_text("outside\n")
    (house.wheels / "leak.txt").symlink_to(secret)
    (house.root / "etc").symlink_to("/etc")
    (house.wheels / "latest.whl").symlink_to(house.wheels / name)  # a link that stays inside is fine
    server = make_server(house.root, "127.0.0.1", 0, log_stream=io.StringIO())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = base_url(server)
        for path in ("wheels/leak.txt", "etc/passwd", "etc/"):
            status, _, body = get(url + path)
            assert status == 404 and b"outside" not in body and b"root:" not in body, (path, status)
        status, _, listing = get(url + "wheels/")
        assert status == 200 and b"leak.txt" not in listing and name.encode() in listing
        status, _, body = get(url + "wheels/latest.whl")
        assert status == 200 and hashlib.sha256(body).hexdigest() == hashlib.sha256(
            (house.wheels / name).read_bytes()).hexdigest(), "the inside link serves the wheel"
    finally:
        server.shutdown()
        server.server_close()
