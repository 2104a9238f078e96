"""Wheels as immutable release assets (builder/index/assets.py, export.py): the pages link every wheel by absolute
URL with its sha256, the Pages tree holds no wheel, an asset's bytes never change, and `builder index pull` restores
such an index from two hosts (pages on one, assets on another), checking every sha256.

The unit tests serve folders with ``http.server`` threads on 127.0.0.1 (the pages tree on one port, the assets on
another). The one integration test (``e2e``) is the issue's demo through the real CLI: publish, export, `builder
serve` for the pages and ``python -m http.server`` for the assets, pip and uv installing into fresh venvs from the
pages URL, and `builder index pull` restoring it (and refusing a corrupted asset by name)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core.errors import ChecksumError, PublishError, SourceError, UsageError
from builder.index.assets import AssetStore
from builder.index.export import export_assets, export_pages
from builder.index.mirror import pull
from builder.index.pages import listed
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.helpers import ROOT, CliResult, assert_one_line_error, http_server, run_cli
from tests.test_index import labelled_wheel, raw_wheel
from tests.test_index_clients import _clean_env
from tests.test_publish_txn import make_wheel

GITHUB = "https://github.com/owner/repo/releases/download/{project}-{version}/"
ALPHA = "alpha-1.0+cu130torch2.14-py3-none-any.whl"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Redirect(SimpleHTTPRequestHandler):
    """Answers every GET with 302 to the same path on ``target`` (as GitHub sends release downloads elsewhere)."""

    target = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target + self.path.lstrip("/"))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _serving(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 with ``handler``, its URL while the block runs."""
    with http_server(handler) as url:
        yield url


def redirecting_server(target: str) -> AbstractContextManager[str]:
    return _serving(type("Redirect", (_Redirect,), {"target": target}))


def static_server(folder: Path) -> AbstractContextManager[str]:
    """``folder`` served by a plain http.server on 127.0.0.1 (a static host: no negotiation), its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    return _serving(partial(_QuietHandler, directory=str(folder)))


def published(tmp: Path) -> Wheelhouse:
    """Two labelled wheels of alpha (one per channel) and an unlabelled beta, each with a record."""
    house = Wheelhouse(tmp / "wh")
    for label in ("cu130torch2.14", "cu128torch2.10"):
        house.publish(labelled_wheel(tmp, "alpha", "1.0", label), BuildRecord.from_json({"cache_key": label}))
    house.publish(raw_wheel(tmp / "beta", "beta", "2.0"), BuildRecord.from_json({"cache_key": "beta"}))
    return house


def anchors(page: Path) -> dict[str, str]:
    """File name → href of every link on a PEP 503 page."""
    return {m.group(2): m.group(1) for m in re.finditer(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', page.read_text())}


# ---------------------------------------------------------------- the setting and the URLs


def test_asset_urls_name_the_release_of_each_wheel() -> None:
    store = AssetStore.parse(GITHUB)
    assert store.prefix == "https://github.com/owner/repo/releases/download/"
    assert store.folder_of(ALPHA) == "alpha-1.0/"  # the public version: every label of 1.0 in one release
    assert store.url_of(ALPHA) == f"{store.prefix}alpha-1.0/alpha-1.0%2Bcu130torch2.14-py3-none-any.whl"
    flat = AssetStore.parse("file:///srv/assets/")
    assert flat.folder_of(ALPHA) == "" and flat.url_of(ALPHA) == "file:///srv/assets/alpha-1.0%2Bcu130torch2.14-py3-none-any.whl"
    for bad, needle in [("https://h/x", "must end in /"), ("ftp://h/", "not an http(s)"),
                        ("https://h/{name}/", "names name"), ("https://{project}.h/", "only after the host"),
                        ("https://h/a/?x=1/", "no query")]:
        with pytest.raises(UsageError, match=re.escape(needle)):
            AssetStore.parse(bad)


def test_pages_link_each_wheel_at_its_asset_url_with_its_sha256(tmp_path: Path) -> None:
    house = published(tmp_path)
    relative = {p: anchors(p) for p in sorted(house.simple.rglob("index.html"))}
    house.set_assets(AssetStore.parse(GITHUB))
    assert json.loads(house.assets_file.read_text()) == {"url": GITHUB}
    store = house.assets()
    assert store is not None
    wheels = {w.name: sha(w) for w in house.wheel_files()}
    for label in (None, "cu130torch2.14"):
        html_links = anchors(house.project_page("alpha", label))
        files = json.loads(house.project_page("alpha", label, json=True).read_text())["files"]
        for name in html_links:
            assert html_links[name] == f"{store.url_of(name)}#sha256={wheels[name]}"
        assert {f["filename"]: (f["url"], f["hashes"]["sha256"]) for f in files} == {
            n: (store.url_of(n), wheels[n]) for n in html_links}
    assert anchors(house.project_page("beta"))["beta-2.0-py3-none-any.whl"].startswith(
        "https://github.com/owner/repo/releases/download/beta-2.0/beta-2.0-py3-none-any.whl#sha256=")
    assert f'href="{store.url_of(ALPHA)}"' in house.dashboard.read_text()  # the dashboard's wheel link too
    record = house.record_of(ALPHA)
    assert listed(house, ALPHA, wheels[ALPHA], record)
    assert house.find_record("cu130torch2.14") is not None

    house.set_assets(None)  # back to wheels/: the same pages as before the setting
    assert not house.assets_file.exists()
    assert {p: anchors(p) for p in sorted(house.simple.rglob("index.html"))} == relative
    assert listed(house, ALPHA, wheels[ALPHA], record)


def test_an_asset_name_keeps_its_bytes(tmp_path: Path) -> None:
    """With assets set, other bytes under a published file name are refused, even with --replace; without, the
    replacement works as before."""
    house = Wheelhouse(tmp_path / "wh")
    first = make_wheel(tmp_path / "a", "alpha", "1.0", key="k1", payload=100)
    second = make_wheel(tmp_path / "b", "alpha", "1.0", key="k2", payload=100)
    assert first.name == second.name and sha(first) != sha(second)
    house.publish(first, BuildRecord.from_json({"cache_key": "k1"}))
    house.set_assets(AssetStore.parse("https://assets.example/wheels/"))
    house.publish(first, BuildRecord.from_json({"cache_key": "k1"}))  # the same bytes again: fine
    with pytest.raises(PublishError, match=r"its release asset https://assets\.example/wheels/alpha-1\.0%2B.* "
                                           r"already holds other bytes .*a URL's bytes never change"):
        house.publish(second, BuildRecord.from_json({"cache_key": "k2"}), replace=True)
    assert sha(house.wheel_file(first.name)) == sha(first)
    house.set_assets(None)
    house.publish(second, BuildRecord.from_json({"cache_key": "k2"}), replace=True)
    assert sha(house.wheel_file(first.name)) == sha(second)


# ---------------------------------------------------------------- export: the assets and the Pages tree


def test_export_lays_out_the_assets_and_refuses_other_bytes(tmp_path: Path) -> None:
    house = published(tmp_path)
    house.set_assets(AssetStore.parse("https://h/{project}-{version}/"))
    out = tmp_path / "releases"
    done = export_assets(house, out)
    expected = sorted(f"{'alpha-1.0' if w.name.startswith('alpha') else 'beta-2.0'}/{w.name}{ext}"
                      for w in house.wheel_files() for ext in ("", ".metadata"))
    assert sorted(done.written) == expected and done.present == ()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == expected
    assert all(sha(out / rel) == sha(house.wheels / Path(rel).name) for rel in expected)
    assert all((out / rel).stat().st_nlink == 1 for rel in expected)  # copies: `builder serve` refuses links

    again = export_assets(house, out)
    assert again.written == () and sorted(again.present) == expected

    house.publish(raw_wheel(tmp_path / "gamma", "gamma", "3.0"), BuildRecord.from_json({}))
    tampered = out / "alpha-1.0" / ALPHA
    tampered.write_bytes(tampered.read_bytes() + b"x")
    with pytest.raises(PublishError, match=rf"refusing to overwrite the asset {re.escape(str(tampered))}: .*"
                                           r"nothing was written"):
        export_assets(house, out)
    assert not (out / "gamma-3.0").exists(), "nothing is written before every asset is checked"


def test_index_export_refuses_a_wheelhouse_state_with_the_publish_exit_code(tmp_path: Path) -> None:
    """Issue 42: `builder index export` said exit 2 (a bad command line) where the wheelhouse was the problem:
    nothing published, or no assets URL set. Those are exit 11 now, one line naming the cure; a bad command line
    stays exit 2."""
    def export(house: Path, *flags: str) -> CliResult:
        return run_cli("index", "export", *flags, "--wheelhouse", str(house), env={"BUILDER_CACHE_DIR": str(tmp_path)})

    empty = export(tmp_path / "empty", "--assets", str(tmp_path / "a"))
    assert_one_line_error(empty, f"nothing published in {tmp_path / 'empty'}: no wheel to export", "builder build")
    assert empty.code == 11
    unset = export(published(tmp_path).root, "--pages", str(tmp_path / "site"))
    assert_one_line_error(unset, "has no assets.json", "builder index rebuild --assets-url URL")
    assert unset.code == 11 and not (tmp_path / "site").exists()
    flagless = export(tmp_path / "wh")
    assert_one_line_error(flagless, "nothing to export")
    assert flagless.code == 2


def test_the_pages_tree_holds_everything_but_the_wheels(tmp_path: Path) -> None:
    house = published(tmp_path)
    house.staging().publish(raw_wheel(tmp_path / "staged", "delta", "0.1"), BuildRecord.from_json({}))
    with pytest.raises(PublishError, match="has no assets.json"):
        export_pages(house, tmp_path / "none")
    house.set_assets(AssetStore.parse("https://h/"))
    tree = tmp_path / "site"
    done = export_pages(house, tree)
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert done.files == len(files)
    assert not [f for f in files if f.endswith(".whl")]
    assert not [f for f in files if any(part.startswith(".") for part in f.split("/"))]  # no lock, generations
    assert not [f for f in files if f.startswith("staging/")]
    for wheel in house.wheel_files():
        assert f"wheels/{wheel.name}.metadata" in files and f"records/{wheel.name}.json" in files
    assert {"index.html", "assets.json", "simple/index.json", "simple/alpha/index.json",
            "channels/cu128torch2.10/simple/alpha/index.html"} <= set(files)
    assert not (tree / "simple").is_symlink()
    with pytest.raises(UsageError, match="not an empty folder"):
        export_pages(house, tree)


def test_cli_sets_the_url_and_exports(tmp_path: Path) -> None:
    house = published(tmp_path)
    bad = run_cli("index", "rebuild", "--wheelhouse", str(house.root), "--assets-url", "https://h/wheels")
    assert_one_line_error(bad, "--assets-url 'https://h/wheels': must end in /")
    missing = run_cli("index", "export", "--wheelhouse", str(house.root), "--pages", str(tmp_path / "site"))
    assert_one_line_error(missing, "has no assets.json", "--assets-url URL")
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root), "--assets-url", GITHUB)
    assert result.code == 0 and f"wheels linked as release assets at {GITHUB}" in result.stdout, result.stderr
    result = run_cli("index", "export", "--wheelhouse", str(house.root), "--assets", str(tmp_path / "rel"),
                     "--pages", str(tmp_path / "site"))
    assert result.code == 0, result.stderr
    assert "assets: 6 file(s) written" in result.stdout and "(no wheel)" in result.stdout
    rebuilt = run_cli("index", "rebuild", "--wheelhouse", str(house.root))  # the setting is kept
    assert rebuilt.code == 0 and house.assets() == AssetStore(GITHUB)


# ---------------------------------------------------------------- pull: pages on one host, assets on another


def test_pull_restores_an_index_whose_wheels_live_on_another_host(tmp_path: Path) -> None:
    house = published(tmp_path)
    with static_server(tmp_path / "assets") as assets_url, static_server(tmp_path / "site") as site_url:
        house.set_assets(AssetStore.parse(assets_url + "{project}/"))
        export_assets(house, tmp_path / "assets")
        export_pages(house, tmp_path / "site")
        assert not list((tmp_path / "site").rglob("*.whl"))

        copy = Wheelhouse(tmp_path / "pulled")
        result = pull(site_url, copy)
        assert result is not None and len(result.restore.fetched) == 3
        assert {w.name: sha(w) for w in copy.wheel_files()} == {w.name: sha(w) for w in house.wheel_files()}
        assert copy.assets() == house.assets()  # kept: a rebuild of the copy links the same URLs
        for page in sorted(house.simple.rglob("index.*")):
            assert (copy.root / page.relative_to(house.root)).read_bytes() == page.read_bytes(), page
        copy.rebuild_index()
        assert anchors(copy.project_page("alpha")) == anchors(house.project_page("alpha"))
        assert copy.find_record("beta") is not None

        asset = tmp_path / "assets" / "alpha" / ALPHA
        asset.write_bytes(asset.read_bytes()[:-1] + bytes([asset.read_bytes()[-1] ^ 1]))
        fresh = Wheelhouse(tmp_path / "fresh")
        with pytest.raises(ChecksumError, match=rf"{re.escape(assets_url)}alpha/alpha-1\.0%2Bcu130torch2\.14-py3-none-any"
                                                rf"\.whl: the published {re.escape(ALPHA)} has sha256 .* refused"):
            pull(site_url, fresh)
        assert not fresh.wheel_files() and not fresh.assets_file.exists()

        (tmp_path / "site" / "assets.json").write_text(json.dumps({"url": "https://elsewhere.example/"}))
        with pytest.raises(SourceError, match=r"assets\.json puts alpha-1\.0\+cu128torch2\.10-py3-none-any\.whl at "
                                              r"https://elsewhere\.example/alpha-1\.0%2Bcu128.*, its page links"):
            pull(site_url, fresh)


def test_pull_follows_a_redirect_to_the_asset(tmp_path: Path) -> None:
    """A GitHub release download answers 302 to another host: the pull follows it and checks the bytes it gets."""
    house = published(tmp_path)
    with static_server(tmp_path / "assets") as storage, redirecting_server(storage) as releases, \
            static_server(tmp_path / "site") as site_url:
        house.set_assets(AssetStore.parse(releases + "download/{project}-{version}/"))
        export_assets(house, tmp_path / "assets" / "download")
        export_pages(house, tmp_path / "site")
        copy = Wheelhouse(tmp_path / "pulled")
        result = pull(site_url, copy)
        assert result is not None and len(result.restore.fetched) == 3
        assert {w.name: sha(w) for w in copy.wheel_files()} == {w.name: sha(w) for w in house.wheel_files()}


# ---------------------------------------------------------------- the demo, through the real CLI


def _venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    return folder / "bin" / "python"


def _line_from(proc: subprocess.Popen, needle: str) -> str:
    assert proc.stdout is not None
    for _ in range(20):
        line = proc.stdout.readline()
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} from {proc.args}")


@pytest.mark.e2e  # two servers, two venvs, pip and uv, and the CLI: about 30 s
def test_demo_pages_and_assets_served_apart_installed_and_pulled(tmp_path: Path) -> None:
    from builder.core.uvtool import uv_bin

    house = published(tmp_path)
    assets_dir, site = tmp_path / "assets", tmp_path / "site"
    assets_dir.mkdir()
    servers: list[subprocess.Popen] = []
    try:
        servers.append(subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                         "--directory", str(assets_dir)], stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True))
        port = re.search(r"port (\d+)", _line_from(servers[0], "Serving HTTP"))
        assert port
        assets_url = f"http://127.0.0.1:{port.group(1)}/"
        wh = ["--wheelhouse", str(house.root)]
        assert run_cli("index", "rebuild", *wh, "--assets-url", assets_url + "{project}-{version}/").code == 0
        exported = run_cli("index", "export", *wh, "--assets", str(assets_dir), "--pages", str(site))
        assert exported.code == 0, exported.stderr
        assert not list(site.rglob("*.whl")) and len(list(assets_dir.rglob("*.whl"))) == 3
        servers.append(subprocess.Popen([sys.executable, "-m", "builder", "serve", "--wheelhouse", str(site),
                                         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, cwd=ROOT))
        pages_url = _line_from(servers[1], " at http://").split(" at ", 1)[1].split(" ", 1)[0]
        channel = pages_url + "channels/cu130torch2.14/simple/"
        assert _line_from(servers[1], "channel cu130torch2.14: ").split(": ", 1)[1].strip() == channel
        for client in ("pip", "uv"):
            python = _venv(tmp_path / f"venv-{client}")
            command = ([str(python), "-m", "pip", "install", "--no-cache-dir"] if client == "pip" else
                       [uv_bin(), "pip", "install", "--no-config", "--python", str(python)])
            result = subprocess.run([*command, "--no-deps", "--index-url", channel, "alpha==1.0"], capture_output=True,
                                    text=True, env=_clean_env(tmp_path / client), timeout=300)
            assert result.returncode == 0, f"{client}: {result.stdout}{result.stderr}"
            shown = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('alpha'))"],
                                   capture_output=True, text=True, check=True)
            assert shown.stdout.strip() == "1.0+cu130torch2.14", client

        pulled = run_cli("index", "pull", pages_url, "--wheelhouse", str(tmp_path / "pulled"))
        assert pulled.code == 0 and "3 wheel(s) fetched" in pulled.stdout, pulled.stderr
        copy = Wheelhouse(tmp_path / "pulled")
        assert {w.name: sha(w) for w in copy.wheel_files()} == {w.name: sha(w) for w in house.wheel_files()}
        assert copy.assets() == house.assets()

        asset = assets_dir / "alpha-1.0" / ALPHA
        original = asset.read_bytes()
        asset.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # the same size, other bytes
        refused = run_cli("index", "pull", pages_url, "--wheelhouse", str(tmp_path / "fresh"))
        assert_one_line_error(refused, f"the published {ALPHA} has sha256", "refused, nothing was changed")
        assert refused.code == 5 and not list((tmp_path / "fresh").rglob("*.whl"))
        asset.write_bytes(original + b"tampered")  # longer than its page says: cut off while streaming
        refused = run_cli("index", "pull", pages_url, "--wheelhouse", str(tmp_path / "fresh"))
        assert_one_line_error(refused, f"the published {ALPHA} is larger than", "refused after")
        assert refused.code == 5 and not list((tmp_path / "fresh").rglob("*.whl"))
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=10)
