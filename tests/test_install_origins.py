"""`install --from URL` (and doctor) read a wheelhouse's pages and hand channel URLs to uv, which fetches whatever
those pages link. The origin rule of `index pull` (core/origins.py) applies before anything is read from a link or
handed to uv: the wheelhouse root, its assets.json's prefix, or --allow-origin (issue 40)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from builder.core.errors import SourceError
from builder.index.layout import simple_path
from builder.index.serve import base_url, make_server
from builder.user.wheelhouse import WheelhouseReader
from tests.test_pull_bounds import site

OUTSIDE = ["file:///etc/passwd", "http://169.254.169.254/latest/alpha.whl", "../../../../../etc/passwd"]


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """``builder serve`` of ``folder`` (it answers the JSON pages the reader asks for), its URL."""
    server = make_server(folder, "127.0.0.1", 0, log_stream=io.StringIO())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield base_url(server)
    finally:
        server.shutdown()
        server.server_close()


def _link_everything(page: Path, link: str) -> None:
    data = json.loads(page.read_text())
    for entry in data["files"]:
        entry["url"] = link
    page.write_text(json.dumps(data))


@pytest.mark.parametrize("link", OUTSIDE)
def test_a_project_page_cannot_point_the_reader_elsewhere(tmp_path: Path, link: str) -> None:
    """Before: the reader fetched `link + ".metadata"` and listed the wheel, and uv was handed the page."""
    folder = site(tmp_path)
    _link_everything(folder / "simple" / "alpha" / "index.json", link)
    # a local wheelhouse (file://), then served over http (where `..` climbs from /simple/alpha/ to the http root
    # only: the same origin, which builder serve guards itself)
    for where in (folder, None) if not link.startswith("..") else (folder,):
        with served(folder) as url, pytest.raises(SourceError) as caught:
            WheelhouseReader(where or url).wheels("alpha")
        assert "outside the index's origin" in caught.value.one_line() and "--allow-origin" in caught.value.one_line()


@pytest.mark.parametrize("link", OUTSIDE)
def test_a_channel_page_uv_would_read_is_checked(tmp_path: Path, link: str) -> None:
    folder = site(tmp_path)
    label = "cu130torch2.14"
    _link_everything(folder / simple_path(label) / "alpha" / "index.json", link)
    with served(folder) as url:
        reader = WheelhouseReader(folder if link.startswith("..") else url)
        (wheel,) = [w for w in reader.wheels("alpha") if w.label == label]  # the combined page is clean
        with pytest.raises(SourceError, match="outside the index's origin"):
            reader.check_channel(f"{wheel.index_url}alpha/")


def test_allow_origin_and_the_assets_prefix_open_it(tmp_path: Path) -> None:
    folder = site(tmp_path)
    other = "https://assets.example/releases/"
    _link_everything(folder / "simple" / "alpha" / "index.json", other + "alpha.whl")
    with served(folder) as url:
        with pytest.raises(SourceError):
            WheelhouseReader(url).wheels("alpha")
        assert WheelhouseReader(url, allow=(other,)).origins().allows(other + "alpha.whl")
        (folder / "assets.json").write_text(json.dumps({"url": other}))
        assert WheelhouseReader(url).origins().allows(other + "alpha.whl")


def test_a_clean_wheelhouse_passes(tmp_path: Path) -> None:
    folder = site(tmp_path)
    with served(folder) as url:
        reader = WheelhouseReader(url)
        wheels = reader.wheels("alpha")
        assert wheels, "the fixture wheelhouse lists alpha's wheels"
        for wheel in wheels:
            reader.check_channel(f"{wheel.index_url}alpha/")  # raises on a link outside the origin
