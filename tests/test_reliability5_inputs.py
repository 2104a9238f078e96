"""Issue 54 item 6: inputs that were accepted though wrong are refused in one line: a remote assets.json naming a
local folder, a page redirected to a second host, an export through a symlinked release folder, odd asset URLs,
``coverage NAME==VERSION`` for what is no release, wheelhouse/recipes folders that are not folders, and a
BUILDER_INDEX_TTL that is no number of seconds. Servers on loopback."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core.errors import PublishError, SourceError, UsageError
from builder.core.settings import Settings
from builder.discovery.torchindex import ttl_s
from builder.farm.coverage import coverage_report
from builder.farm.coverageinputs import check_folders
from builder.index.assets import AssetStore
from builder.index.export import export_assets
from builder.index.mirror import pull
from builder.index.store import Wheelhouse
from builder.pipeline import verify
from tests.helpers import ROOT, assert_one_line_error, http_server, run_cli
from tests.test_index_assets import published, static_server
from tests.test_pull_bounds import site


@pytest.mark.parametrize("value", ["-1", "nan", "abc", "inf", "-0.5"])
def test_an_index_ttl_that_is_no_number_of_seconds_is_refused(value: str) -> None:
    with pytest.raises(UsageError, match=rf"BUILDER_INDEX_TTL='{value}' is not a number of seconds >= 0"):
        ttl_s({"BUILDER_INDEX_TTL": value})


def test_an_index_ttl_of_seconds_is_taken() -> None:
    assert ttl_s({"BUILDER_INDEX_TTL": "0"}) == 0 and ttl_s({"BUILDER_INDEX_TTL": " 90 "}) == 90
    assert ttl_s({}) == ttl_s({"BUILDER_INDEX_TTL": ""}) == 24 * 3600


@pytest.mark.parametrize(("url", "says"), [
    ("https://h.example/a b/", "holds ' '"), ("https://h.example/a\nb/", "holds '\\n'"),
    ("https://h.example/\t/", "holds '\\t'"), ("https://h.example/é/", "holds 'é'"),
    ("file:relative/", "a file URL names an absolute folder"), ("file://otherhost/x/", "a file URL names an absolute"),
    ("https://h.example:port/x/", "not a URL"),
])
def test_odd_asset_urls_are_refused(url: str, says: str) -> None:
    with pytest.raises(UsageError, match="--assets-url") as caught:
        AssetStore.parse(url)
    assert says in caught.value.one_line() and "\n" not in caught.value.one_line()


def test_export_refuses_a_release_folder_that_is_a_symlink(tmp_path: Path) -> None:
    house = published(tmp_path)
    house.set_assets(AssetStore.parse("https://h/{project}-{version}/"))
    out, elsewhere = tmp_path / "releases", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "alpha-1.0").symlink_to(elsewhere)
    with pytest.raises(PublishError, match=r"alpha-1\.0 is a symbolic link .*nothing was written"):
        export_assets(house, out)
    assert not list(elsewhere.iterdir()) and not (out / "beta-2.0").exists()


def test_a_remote_assets_json_naming_a_local_folder_is_refused(tmp_path: Path) -> None:
    """Before: followed, the pull read this machine's files and exited 0 (D6)."""
    folder = site(tmp_path)
    (folder / "assets.json").write_text(json.dumps({"url": f"{(tmp_path / 'wh' / 'wheels').as_uri()}/"}))
    with static_server(folder) as url:
        with pytest.raises(SourceError, match=r"assets\.json puts the wheels at file:///.*a folder of this machine, "
                                              r"though the index is remote; refused"):
            pull(url, Wheelhouse(tmp_path / "pulled"))
    assert not (tmp_path / "pulled").exists() or not list((tmp_path / "pulled").rglob("*.whl"))


def test_a_page_redirected_to_a_second_host_is_refused(tmp_path: Path) -> None:
    """Before: the second host's pages stood in for the index, its wheels checked only against its own pages."""
    folder = site(tmp_path)
    with static_server(folder) as other:

        class Redirect(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", other + self.path.lstrip("/"))
                self.send_header("Content-Length", "0")
                self.end_headers()

        with http_server(Redirect) as url:
            with pytest.raises(SourceError, match=rf"{url}simple/index\.json: redirected to {other}simple/index\.json, "
                                                  r"outside the index's origin; refused"):
                pull(url, Wheelhouse(tmp_path / "pulled"))


def _settings(tmp_path: Path, **changes: object) -> Settings:
    base: dict[str, object] = {"cache_dir": tmp_path / "cache", "wheelhouse": tmp_path / "wh",
                               "recipes_dir": ROOT / "recipes", "offline": True}
    return Settings.from_env({}, **{**base, **changes})  # type: ignore[arg-type]


def test_coverage_and_verify_refuse_folders_that_are_not_folders(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match=f"coverage: --wheelhouse {afile} is a file, not a folder"):
        check_folders(_settings(tmp_path, wheelhouse=afile))
    with pytest.raises(UsageError, match=f"coverage: --recipes {tmp_path / 'none'} is not there"):
        check_folders(_settings(tmp_path, recipes_dir=tmp_path / "none"))
    with pytest.raises(UsageError, match=f"verify: --wheelhouse {tmp_path / 'none'} is not there"):
        verify.stable_packages(_settings(tmp_path, wheelhouse=tmp_path / "none"))
    check_folders(_settings(tmp_path))  # a wheelhouse not made yet is a fresh farm's: fine


def _pypi_cache(tmp_path: Path, *versions: str) -> None:
    (tmp_path / "cache" / "index").mkdir(parents=True)
    releases = {v: [{"packagetype": "sdist", "url": f"c-{v}.tar.gz", "filename": f"causal_conv1d-{v}.tar.gz",
                     "digests": {"sha256": "0" * 64}}] for v in versions}
    (tmp_path / "cache" / "index" / "causal-conv1d.json").write_text(json.dumps({"releases": releases}))


@pytest.mark.parametrize(("asked", "says"), [
    ("1.7.0rc1", "causal-conv1d==1.7.0rc1 is not a release of causal-conv1d (not on PyPI, not in the wheelhouse, "
                 "not pinned by the recipe) (releases in the recipe's range: 1.6.1, 1.7.0)"),
    ("1.5.3", "causal-conv1d==1.5.3 is not a release of causal-conv1d"),
    ("1.7.0+cu13", "+cu13 is a wheel's local label, not a release (name the release: causal-conv1d==1.7.0)"),
    ("1" * 5000, "a version of 5000 characters is not a version number"),
    ("1.x", "'1.x' is not a version number"),
])
def test_coverage_of_what_is_no_release_is_refused(tmp_path: Path, asked: str, says: str) -> None:
    _pypi_cache(tmp_path, "1.6.1", "1.7.0")
    with pytest.raises(UsageError) as caught:
        coverage_report([f"causal-conv1d=={asked}"], _settings(tmp_path), indexes=lambda s: [])
    assert says in caught.value.one_line(), caught.value.one_line()


def test_coverage_of_a_release_is_answered(tmp_path: Path) -> None:
    _pypi_cache(tmp_path, "1.6.1", "1.7.0")
    reports, _ = coverage_report(["causal-conv1d==1.6.1"], _settings(tmp_path), indexes=lambda s: [])
    assert [(r.version, r.version_from) for r in reports] == [("1.6.1", "asked")]


def test_coverage_without_a_release_list_says_so(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="PyPI's release list cannot be read"):
        coverage_report(["causal-conv1d==1.5.3"], _settings(tmp_path), indexes=lambda s: [])


def test_cli_5000_digits_is_one_line(tmp_path: Path) -> None:
    result = run_cli("coverage", "causal-conv1d==" + "1" * 5000, "--offline",
                     env={"BUILDER_CACHE_DIR": str(tmp_path / "cache")}, timeout=60)
    assert_one_line_error(result, "a version of 5000 characters is not a version number")
    assert result.code == 2


def test_export_refuses_a_release_folder_that_is_a_file_and_an_asset_that_is_a_folder(tmp_path: Path) -> None:
    """Before: FileExistsError / IsADirectoryError tracebacks half-way through the export."""
    house = published(tmp_path)
    house.set_assets(AssetStore.parse("https://h/{project}-{version}/"))
    out = tmp_path / "releases"
    out.mkdir()
    (out / "alpha-1.0").write_text("x")
    with pytest.raises(PublishError, match=r"alpha-1\.0 is a file, where the export puts a release folder; nothing"):
        export_assets(house, out)
    (out / "alpha-1.0").unlink()
    (out / "beta-2.0" / "beta-2.0-py3-none-any.whl").mkdir(parents=True)
    with pytest.raises(PublishError, match=r"beta-2\.0-py3-none-any\.whl is not a plain file, where the export puts "
                                           r"an asset; nothing was written"):
        export_assets(house, out)
    assert not (out / "alpha-1.0").exists()


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_an_assets_setting_that_is_no_file_is_one_error(tmp_path: Path, kind: str) -> None:
    """Before: IsADirectoryError from `index rebuild`; a fifo hung it."""
    import os

    house = published(tmp_path)
    if kind == "folder":
        house.assets_file.mkdir()
    else:
        os.mkfifo(house.assets_file)
    with pytest.raises(PublishError, match=r"assets\.json is not a plain file \(the wheelhouse's assets setting\)"):
        house.assets()
