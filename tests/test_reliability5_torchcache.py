"""Issue 54 item 5: damaged torch-index cache files (a fifo, a folder, bad JSON, a wrong shape) are read again or
answered from the snapshot; never a hang on a fifo, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.core.settings import Settings
from builder.discovery.torchindex import cache_file, discover, toolkit_versions

URL = "https://pypi.org/simple"


def damage(path: Path, how: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    else:
        path.write_text({"bad json": "{not json", "shape": '{"releases": 5, "read_at": 3}', "list": "[1, 2]"}[how])


@pytest.mark.timeout(20)
@pytest.mark.parametrize("how", ["fifo", "folder", "bad json", "shape", "list"])
def test_a_damaged_cache_is_not_trusted(tmp_path: Path, how: str) -> None:
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", offline=True)
    damage(cache_file(settings, URL), how)
    damage(settings.cache("index") / "cuda-toolkit-versions.json", how)
    listing = discover("pypi", URL, settings)
    assert listing.source == "snapshot" and listing.releases  # offline: the shipped snapshot answers
    versions, where = toolkit_versions(settings)
    assert where.startswith("snapshot of") and versions
