"""`builder index rebuild --assets-url` and `builder index export` against hostile templates (issue 40, item 3): a
``..`` that would lay assets outside the export folder, a format spec that asks for a gigabyte of padding. Each is
refused in one line at parse time, through the real CLI, and nothing is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.index.assets import AssetStore
from tests.helpers import assert_one_line_error, run_cli
from tests.test_index_assets import published

CLIMBING = ["https://h.example/releases/../../x/", "https://h.example/{project}/../../../../tmp/",
            "https://h.example/a/%2e%2e/%2E%2E/{project}/", "file:///srv/assets/../../etc/", "https://h.example/./x/",
            "https://h.example/a\\..\\b/"]
SPECS = ["https://h.example/{project:999999999}/", "https://h.example/{version!r}/",
         "https://h.example/{project:>{version}}/", "https://h.example/{version:x<99999999999}/"]


@pytest.mark.parametrize("url", CLIMBING + SPECS)
def test_a_hostile_template_is_refused_at_parse(url: str) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        AssetStore.parse(url)
    assert time.monotonic() - started < 1
    assert "\n" not in caught.value.one_line()


@pytest.mark.parametrize("url", ["https://h.example/{project:999999999}/", "https://h.example/{project}/../../../x/"])
def test_the_cli_refuses_in_one_line_and_writes_nothing(tmp_path: Path, url: str) -> None:
    house = published(tmp_path)
    before = sorted(p.name for p in house.root.rglob("*"))
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root), "--assets-url", url)
    assert_one_line_error(result, "--assets-url")
    assert result.code == 2
    assert sorted(p.name for p in house.root.rglob("*")) == before and not house.assets_file.exists()


def test_an_assets_json_written_by_hand_with_dotdot_is_refused_by_export(tmp_path: Path) -> None:
    """assets.json edited by hand (or pulled from elsewhere before this check) with a climbing URL: the export reads
    it through the same parser and refuses; nothing lands outside (or inside) the export folder."""
    house = published(tmp_path)
    house.assets_file.write_text('{"url": "https://h.example/{project}/../../../../escaped/"}')
    result = run_cli("index", "export", "--wheelhouse", str(house.root), "--assets", str(tmp_path / "out" / "a"))
    assert_one_line_error(result, "'..' segment")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out").exists()


def test_fields_and_plain_urls_still_work() -> None:
    store = AssetStore.parse("https://github.com/o/r/releases/download/{project}-{version}/")
    assert store.url_of("alpha-1.0+cu130torch2.14-py3-none-any.whl") == (
        "https://github.com/o/r/releases/download/alpha-1.0/alpha-1.0%2Bcu130torch2.14-py3-none-any.whl")
