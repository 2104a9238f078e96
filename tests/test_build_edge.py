"""Issue 40 (round 4): bad `build` inputs are refused at parse, before a cache folder, a venv, a download or a
stage (`==> ` line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize(("source", "needle"), [
    ("/nope/x.tar.gz", "no such file or folder"),
    ("", "no such file or folder"),
    ("gopher://h/x.tar.gz", "the scheme must be one of https, http, file"),
    ("git+gopher://h/repo", "after git+"),
    ("https://", "is not a source URL"),
])
def test_a_bad_source_is_refused_before_anything_is_made(tmp_path: Path, source: str, needle: str) -> None:
    cache, house = tmp_path / "cache", tmp_path / "wh"
    result = run_cli("build", "causal-conv1d", "--version", "1.6.0", "--cuda", "13.0", "--arch", "90", "--offline",
                     "--cache-dir", str(cache), "--wheelhouse", str(house), "--source", source)
    assert result.code == 2
    assert_one_line_error(result, "argument --source", needle)
    assert "==> " not in result.stdout + result.stderr
    assert not cache.exists() and not house.exists()
