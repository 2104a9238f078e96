"""`builder index pull` against a hostile published index (issue 40, items 2 and 3): pages that point at local files
or other hosts, a wheel that never ends, redirects to ftp:// or in a loop, an assets.json of 50 MB, wrong-typed
JSON. Real http.server threads on 127.0.0.1 serve a real published wheelhouse; every refusal is one line and the
pulled wheelhouse is not created."""

from __future__ import annotations

import json
import time
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core.errors import BuilderError, ChecksumError, SourceError
from builder.core.net import TooLarge
from builder.index.assets import MAX_ASSETS_FILE
from builder.index.mirror import pull
from builder.index.store import Wheelhouse
from tests.helpers import assert_one_line_error, run_cli
from tests.test_index_assets import _serving, published, static_server

ALPHA = "alpha-1.0+cu130torch2.14-py3-none-any.whl"


def site(tmp: Path) -> Path:
    """A published wheelhouse copied into a plain folder (what a static host serves): links dereferenced."""
    import shutil

    house = published(tmp)
    folder = tmp / "site"
    shutil.copytree(house.root, folder, symlinks=False, ignore=shutil.ignore_patterns(".*"))
    return folder


def edit_page(folder: Path, project: str, change: dict) -> None:
    page = folder / "simple" / project / "index.json"
    data = json.loads(page.read_text())
    data["files"][0].update(change)
    page.write_text(json.dumps(data))


def refused(folder_url: str, tmp: Path, error: type[BuilderError], *needles: str) -> str:
    """Pull, expect ``error`` naming every needle within 10 s, and nothing written."""
    target = tmp / "pulled"
    started = time.monotonic()
    with pytest.raises(error) as caught:
        pull(folder_url, Wheelhouse(target))
    assert time.monotonic() - started < 10
    message = caught.value.one_line()
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message
    assert not any(p.suffix == ".whl" for p in target.rglob("*")), "nothing pulled"
    return message


@pytest.mark.parametrize("link", ["file:///dev/zero", "file:///etc/passwd",
                                  "http://169.254.169.254/latest/alpha.whl", "ftp://127.0.0.1/alpha.whl"])
def test_a_page_cannot_point_the_pull_elsewhere(tmp_path: Path, link: str) -> None:
    """Issue 40 item 3: a remote page's wheel URL was fetched wherever it pointed (`file:///dev/zero` streamed
    without end). Only the index's own origin is read."""
    folder = site(tmp_path)
    edit_page(folder, "alpha", {"url": link})
    with static_server(folder) as url:
        refused(url, tmp_path, SourceError, "outside the index's origin", "--allow-origin")


def test_a_page_cannot_point_above_the_index_root(tmp_path: Path) -> None:
    """An index published under a path (a GitHub Pages project site, ``https://owner.github.io/repo/``): a page
    linking ``/etc/passwd`` (another site of the same host) is refused."""
    site(tmp_path)
    edit_page(tmp_path / "site", "alpha", {"url": "/etc/passwd"})
    with static_server(tmp_path) as url:
        refused(url + "site/", tmp_path, SourceError, "outside the index's origin", "/etc/passwd")


def test_a_local_index_cannot_point_outside_its_folder(tmp_path: Path) -> None:
    """A pull from a folder (file://): a page naming ``../../etc/passwd`` or an absolute path is refused too."""
    folder = site(tmp_path)
    edit_page(folder, "alpha", {"url": "../../../../../../../../etc/passwd"})
    message = refused(str(folder), tmp_path, SourceError, "outside the index's origin")
    assert "/etc/passwd" in message


class _Endless(SimpleHTTPRequestHandler):
    """Serves the folder, but every wheel as an endless stream of zeros (no Content-Length); counts what it sent."""

    sent: list[int] = []

    def do_GET(self) -> None:
        if not self.path.endswith(".whl"):
            return super().do_GET()
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        total = 0
        try:
            while total < 1 << 30:
                self.wfile.write(b"\0" * 65536)
                total += 65536
        except OSError:
            pass
        self.sent.append(total)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_wheel_download_stops_at_its_declared_size(tmp_path: Path) -> None:
    """Issue 40 item 2: 3 GiB were streamed for a 1.4 KB wheel; the download now stops one byte past the size the
    page declares."""
    folder = site(tmp_path)
    from functools import partial

    handler = partial(type("Endless", (_Endless,), {"sent": []}), directory=str(folder))
    with _serving(handler) as url:
        refused(url, tmp_path, ChecksumError, "larger than", "bytes its page says")
    sent = handler.func.sent  # type: ignore[attr-defined]
    assert sent and max(sent) < 16 << 20, f"the server sent {sent} bytes before the client stopped"


class _RedirectWheels(SimpleHTTPRequestHandler):
    """Serves the folder, but answers a wheel with a redirect to ``target`` (``{self}``: back to itself)."""

    target = ""

    def do_GET(self) -> None:
        if not self.path.endswith(".whl"):
            return super().do_GET()
        self.send_response(302)
        self.send_header("Location", self.target.replace("{self}", self.path + "x.whl"))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(("target", "needle"), [("ftp://127.0.0.1:9/alpha.whl", "which is not http(s)://"),
                                                 ("file:///dev/zero", "which is not http(s)://"),
                                                 ("{self}", "more than 5 redirects")])
def test_redirects_are_bounded_and_rechecked(tmp_path: Path, target: str, needle: str) -> None:
    """Issue 40 item 3: a redirect to ftp:// was followed by urllib's FTP handler, outside the deadline's watchdog."""
    folder = site(tmp_path)
    from functools import partial

    handler = partial(type("R", (_RedirectWheels,), {"target": target}), directory=str(folder))
    with _serving(handler) as url:
        refused(url, tmp_path, SourceError, needle)


def test_a_50_mb_assets_json_is_refused_at_its_cap(tmp_path: Path) -> None:
    """Issue 40 item 2: a 50 MB assets.json was read whole (and took > 180 s); it may hold 64 KiB."""
    folder = site(tmp_path)
    (folder / "assets.json").write_bytes(b'{"url": "https://h/' + b"a" * (50 << 20) + b'/"}')
    with static_server(folder) as url:
        refused(url, tmp_path, TooLarge, "assets.json", f"more than the {MAX_ASSETS_FILE} bytes")


@pytest.mark.parametrize("change", [{"size": "1408"}, {"size": 1.5}, {"size": -1}, {"url": 7},
                                    {"hashes": ["sha256"]}, {"filename": None}, {"core-metadata": True}])
def test_wrong_typed_page_entries_are_one_line(tmp_path: Path, change: dict) -> None:
    folder = site(tmp_path)
    edit_page(folder, "alpha", change)
    with static_server(folder) as url:
        refused(url, tmp_path, SourceError, "index.json: an entry without a usable")


@pytest.mark.parametrize("top", [{"projects": "alpha"}, {"projects": {"name": "x"}}])
def test_a_wrong_typed_top_page_is_one_line(tmp_path: Path, top: dict) -> None:
    folder = site(tmp_path)
    (folder / "simple" / "index.json").write_text(json.dumps(top))
    with static_server(folder) as url:
        refused(url, tmp_path, SourceError, "simple/index.json")


def test_a_wrong_typed_record_is_one_line(tmp_path: Path) -> None:
    folder = site(tmp_path)
    record = next((folder / "records").glob("alpha-*.json"))
    data = json.loads(record.read_text())
    data["archs"] = 90
    data["cuda"] = ["x"]
    record.write_text(json.dumps(data))
    with static_server(folder) as url:
        refused(url, tmp_path, SourceError, "the published record of")


def test_the_cli_refuses_in_one_line_and_allow_origin_opens_it(tmp_path: Path) -> None:
    """Through the real CLI: exit 4, one line; the same page pulled with --allow-origin for the host it names."""
    folder = site(tmp_path)
    with static_server(tmp_path / "elsewhere") as other:
        wheel = next((folder / "wheels").glob("alpha-*cu130*.whl"))
        (tmp_path / "elsewhere" / wheel.name).write_bytes(wheel.read_bytes())
        (tmp_path / "elsewhere" / (wheel.name + ".metadata")).write_bytes(
            (folder / "wheels" / (wheel.name + ".metadata")).read_bytes())
        page = folder / "simple" / "alpha" / "index.json"
        data = json.loads(page.read_text())
        for entry in data["files"]:
            if entry["filename"] == wheel.name:
                entry["url"] = other + wheel.name.replace("+", "%2B")
        page.write_text(json.dumps(data))
        with static_server(folder) as url:
            result = run_cli("index", "pull", url, "--wheelhouse", str(tmp_path / "pulled"))
            assert_one_line_error(result, "outside the index's origin")
            assert result.code == 4 and not (tmp_path / "pulled").exists()
            result = run_cli("index", "pull", url, "--wheelhouse", str(tmp_path / "pulled"), "--allow-origin", other)
            assert result.code == 0, result.stderr


def test_install_from_a_wheelhouse_with_a_huge_page_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`install --from` read pages whole; a page past the cap (lowered here to 1 MiB, 64 MiB by default) is refused."""
    from builder.user import wheelhouse

    monkeypatch.setattr(wheelhouse, "MAX_ANSWER", 1 << 20)
    folder = site(tmp_path)
    for page in ("index.json", "index.html"):  # a static host answers simple/ with its index.html
        (folder / "simple" / page).write_bytes(b'{"projects": [' + b" " * (2 << 20) + b"]}")
    with static_server(folder) as url:
        with pytest.raises(TooLarge, match="simple/: the answer .* more than the 1048576 bytes"):
            wheelhouse.WheelhouseReader(url).projects()
