"""Issue 54 items 1 and 2: the torch-index reader is bounded and shape-checked, all its reads of one command share one
deadline, and a host that gave no answer is not asked again by the same process. Every server is on loopback."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core import net
from builder.discovery import simpleindex
from builder.discovery.simpleindex import PageError, WheelFile, project_files, wheel_metadata
from builder.discovery.torchindex import read_index
from tests.helpers import assert_one_line_error, http_server, run_cli, tarpit

WHEEL = "torch-2.9.0-cp312-cp312-manylinux_2_28_x86_64.whl"


def _serving(pages: dict[str, tuple[bytes, str]], drip: str | None = None) -> type[BaseHTTPRequestHandler]:
    """A handler answering ``pages`` (path → body, content type); paths ending in ``drip`` send a byte a second."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if drip is not None and self.path.endswith(drip):
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                try:
                    for _ in range(1000):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(1)
                except OSError:
                    return
            body, kind = pages.get(self.path, (b"", ""))
            self.send_response(200 if kind else 404)
            self.send_header("Content-Type", kind or "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


JSON = "application/vnd.pypi.simple.v1+json"


@pytest.mark.parametrize(("body", "says"), [
    (b"[1, 2]", "the page's JSON is a list, not an object"),
    (b'{"files": 5}', "the page's 'files' is a number, not a list"),
    (json.dumps({"files": [{"url": "x.whl"}]}).encode(), "file 1 of the page has no filename"),
    (json.dumps({"files": [{"filename": WHEEL}]}).encode(), f"file 1 of the page ('{WHEEL}') has no url"),
    (json.dumps({"files": ["x"]}).encode(), "file 1 of the page is a string, not an object"),
    (b"[" * 100_000 + b"]" * 100_000, "the page's JSON is nested deeper than it can be read"),
    (b"{not json", "the page is not JSON"),
])
def test_a_page_of_the_wrong_shape_is_one_error_naming_url_and_fault(body: bytes, says: str) -> None:
    with http_server(_serving({"/simple/torch/": (body, JSON)})) as root:
        with pytest.raises(PageError) as caught:
            project_files(root + "simple")
    assert str(caught.value).startswith(f"{root}simple/torch/: {says}"), str(caught.value)
    assert isinstance(caught.value, ValueError)  # discover's fallback to the cache still catches it


def test_too_many_anchors_are_refused_without_reading_the_whole_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simpleindex, "MAX_FILES", 1000)
    page = b"<html>" + b"<a href='x'>x</a>" * 200_000
    with http_server(_serving({"/simple/torch/": (page, "text/html")})) as root:
        started = time.monotonic()
        with pytest.raises(PageError, match="the page has more than 1000 links"):
            project_files(root + "simple")
    assert time.monotonic() - started < 1.5


def test_a_tag_that_never_closes_is_refused() -> None:
    page = b"<html><a href='" + b"x" * (3 << 20)
    with http_server(_serving({"/simple/torch/": (page, "text/html")})) as root:
        with pytest.raises(PageError, match="a tag longer than"):
            project_files(root + "simple")


def test_page_and_metadata_past_their_caps_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simpleindex, "MAX_PAGE_BYTES", 10_000)
    monkeypatch.setattr(simpleindex, "MAX_METADATA_BYTES", 1000)
    big = json.dumps({"files": [{"filename": WHEEL, "url": WHEEL, "pad": "x" * 20_000}]}).encode()
    with http_server(_serving({"/big/torch/": (big, JSON), f"/w/{WHEEL}.metadata": (b"M" * 5000, "text/plain")})) \
            as root:
        with pytest.raises(PageError, match="more than the 10000 bytes it may have; refused"):
            project_files(root + "big")
        with pytest.raises(PageError, match="more than the 1000 bytes it may have"):
            wheel_metadata(WheelFile(WHEEL, f"{root}w/{WHEEL}", True))


def test_a_remote_page_linking_a_local_file_is_refused() -> None:
    page = json.dumps({"files": [{"filename": WHEEL, "url": f"file:///etc/{WHEEL}"}]}).encode()
    with http_server(_serving({"/simple/torch/": (page, JSON)})) as root:
        with pytest.raises(PageError, match="which is not http"):
            project_files(root + "simple")


def test_a_local_page_past_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simpleindex, "MAX_PAGE_BYTES", 100)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a href='x.whl'>x</a>" * 50)
    with pytest.raises(PageError, match="more than 100 bytes"):
        project_files(tmp_path.as_uri())


def test_all_reads_of_one_index_share_one_deadline() -> None:
    """20 unlabelled releases whose METADATA drips a byte a second: before, each read had the whole deadline
    (hours at the default); now the index read as a whole ends at the deadline, the releases left unread."""
    files = [{"filename": f"torch-2.{n}.0-cp312-cp312-manylinux_2_28_x86_64.whl",
              "url": f"torch-2.{n}.0-cp312-cp312-manylinux_2_28_x86_64.whl", "core-metadata": True}
             for n in range(20)]
    net.use(net.NetPolicy(deadline_s=1.0, read_timeout_s=5.0, retries=0))
    with http_server(_serving({"/simple/torch/": (json.dumps({"files": files}).encode(), JSON)}, drip=".metadata")) \
            as root:
        started = time.monotonic()
        listing = read_index("custom", root + "simple")
        took = time.monotonic() - started
    assert took < 2.0, took
    assert len(listing.releases) == 20
    assert all(r.cuda is None for r in listing.releases)
    assert any("torch-index reads of this command took their whole 1 s" in r.evidence for r in listing.releases)


def test_a_silent_host_costs_one_deadline_per_process() -> None:
    """A host that never answers: the first fetch waits the deadline, the next ones (any path on it) fail at once
    with the first failure's line."""
    net.use(net.NetPolicy(deadline_s=0.5, connect_timeout_s=5.0, read_timeout_s=5.0, retries=0))
    with tarpit() as url:
        started = time.monotonic()
        with pytest.raises(net.NetError, match="gave up at the 0.5 s network deadline"):
            net.fetch_bytes(url + "pypi/a/json")
        first = time.monotonic() - started
        started = time.monotonic()
        for name in ("a", "b", "c"):
            with pytest.raises(net.NetError, match="not asked again: .* gave up at the 0.5 s network deadline"):
                net.fetch_bytes(url + f"pypi/{name}/json")
        again = time.monotonic() - started
    assert first >= 0.45 and again < 0.1, (first, again)


def test_a_url_answering_503_is_remembered_alone() -> None:
    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(503 if self.path == "/busy" else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    net.use(net.NetPolicy(retries=0, backoff_s=0.01))
    with http_server(Busy) as root:
        with pytest.raises(net.NetError, match="HTTP 503"):
            net.fetch_bytes(root + "busy")
        with pytest.raises(net.NetError, match="not asked again"):
            net.fetch_bytes(root + "busy")
        assert net.fetch_bytes(root + "fine") == b"ok"  # the host answers: its other URLs are asked


def test_cli_torch_index_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    with http_server(_serving({"/simple/torch/": (b'{"files": 5}', JSON)})) as root:
        result = run_cli("torch-table", "--torch-index", root + "simple",
                         env={"BUILDER_CACHE_DIR": str(tmp_path / "cache")}, timeout=60)
    assert_one_line_error(result, f"{root}simple/torch/: the page's 'files' is a number, not a list; refused")
