"""Each network fault gets the cure that fits it (issue 40 item 4): an unknown host, a refused connection, a
timeout, a TLS failure, HTTP 403, 404 and 500, through `index pull` and `install --from`'s wheelhouse reader.
Before, a bad certificate was told to "start `builder serve` there" and HTTP 500 to wait longer for a byte."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core.errors import SourceError
from builder.index.mirror import pull
from builder.index.store import Wheelhouse
from builder.user.wheelhouse import WheelhouseReader
from tests.helpers import http_server, tarpit


class _Status(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _server(status: int, context: ssl.SSLContext | None = None) -> Iterator[str]:
    with http_server(type("S", (_Status,), {"status": status}), context) as url:
        yield url


@contextmanager
def _tls(tmp: Path) -> Iterator[str]:
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a self-signed certificate")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", tmp / "key.pem",
                    "-out", tmp / "cert.pem", "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    with _server(200, context) as url:
        yield url


@contextmanager
def _fixed(url: str) -> Iterator[str]:
    yield url


def _no_such_host(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], AbstractContextManager[str]]:
    def refuse(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return lambda tmp: _fixed("http://wheels.example.invalid/")


# fault → (a context giving the URL, words of the cause, words of the cure, words the cure must not have)
FAULTS: dict[str, tuple[Callable[..., object], str, str, str]] = {
    "dns": (lambda tmp: None, "names a host that does not resolve", "check the host name", "builder serve"),
    "refused": (lambda tmp: _fixed("http://127.0.0.1:9/"), "refused the connection", "builder serve",
                "BUILDER_NET_TIMEOUT"),
    "timeout": (lambda tmp: tarpit(), "nothing came for 1 s", "BUILDER_NET_TIMEOUT", "builder serve"),
    "tls": (_tls, "TLS certificate this machine does not trust", "SSL_CERT_FILE", "builder serve"),
    "403": (lambda tmp: _server(403), "refused access (HTTP 403)", "credentials", "builder serve"),
    "500": (lambda tmp: _server(500), "HTTP 500", "the fault is the server's", "BUILDER_NET_TIMEOUT"),
}


@pytest.mark.parametrize("reader", ["pull", "install --from"])
@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_gets_its_cure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, reader: str) -> None:
    monkeypatch.setenv("BUILDER_NET_TIMEOUT", "1")
    monkeypatch.setenv("BUILDER_NET_RETRIES", "0")
    make, cause, cure, wrong = FAULTS[fault]
    context = _no_such_host(monkeypatch)(tmp_path) if fault == "dns" else make(tmp_path)
    with context as url, pytest.raises(SourceError) as caught:  # type: ignore[attr-defined]
        if reader == "pull":
            pull(url, Wheelhouse(tmp_path / "pulled"))
        else:
            WheelhouseReader(url).projects()
    error = caught.value
    assert cause in error.message, error.one_line()
    assert error.hint and cure in error.hint and wrong not in error.hint, error.one_line()
    assert "\n" not in error.one_line()
    assert not (tmp_path / "pulled").exists()


def test_a_missing_page_is_not_there(tmp_path: Path) -> None:
    """HTTP 404 on the root page keeps its own message (no index there) in both readers."""
    with _server(404) as url:
        with pytest.raises(SourceError, match="no published index at"):
            pull(url, Wheelhouse(tmp_path / "pulled"))
        with pytest.raises(SourceError, match="has no index pages"):
            WheelhouseReader(url).projects()
