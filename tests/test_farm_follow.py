"""The farm follows the indexes: torch-newest = N, archs-where-supported, and `builder watch`'s torch/CUDA rows.

Offline settings with an empty cache answer from the shipped snapshot (deterministic, no network); the watch test
reads the local fixture index of test_torchindex.py (a tiny HTTP server thread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.settings import Settings
from builder.discovery.torchindex import PYPI_SIMPLE, load_snapshot
from builder.farm.expand import expand
from builder.farm.spec import FarmError, load_farm
from builder.farm.watch import watch_torch
from builder.model.arch import format_arch_list
from tests.helpers import DEMO_RECIPE, write_recipes
from tests.test_torchindex import fixture_index  # noqa: F401 - the fixture


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_recipes(tmp_path, {"demo": DEMO_RECIPE})
    return tmp_path


def _settings(tree: Path, offline: bool = True) -> Settings:
    return Settings.from_env({}, cache_dir=tree / "cache", wheelhouse=tree / "wheelhouse",
                             recipes_dir=tree / "recipes", offline=offline)


def _farm(tree: Path, body: str) -> Path:
    path = tree / "farm.toml"
    path.write_text('[defaults]\nrecipes = "recipes"\npython = "3.12"\n' + body
                    + '\n[[package]]\nname = "demo"\nversions = ["1.0"]\n')
    return path


def _releases(name: str, settings: Settings) -> list[str]:
    return ["1.0"]


def _snapshot_newest(cuda: str, count: int) -> list[str]:
    table = load_snapshot()[PYPI_SIMPLE].torch_by_cuda()[cuda]
    newest: dict[tuple[int, ...], str] = {}
    from packaging.version import Version

    for v in table:
        key = Version(v).release[:2]
        if key not in newest or Version(v) > Version(newest[key]):
            newest[key] = v
    return [newest[k] for k in sorted(newest, reverse=True)[:count]]


def test_torch_newest_takes_the_newest_minors_per_cuda(tree: Path) -> None:
    farm = load_farm(_farm(tree, 'cuda = ["13.0", "13.2"]\narchs = "120"\ntorch-newest = 2\n'))
    targets = expand(farm, _settings(tree), releases=_releases)
    by_cuda: dict[str, list[str]] = {}
    for t in targets:
        by_cuda.setdefault(str(t.cuda), []).append(t.torch)
    assert by_cuda["13.0"] == _snapshot_newest("13.0", 2) and len(by_cuda["13.0"]) == 2
    assert by_cuda["13.2"] == _snapshot_newest("13.2", 2)
    assert "2.15.0" in by_cuda["13.2"]  # PyPI's CUDA 13.2 build, with no table edited


def test_torch_newest_and_torch_together_are_refused(tree: Path) -> None:
    with pytest.raises(FarmError, match="gives both 'torch' and 'torch-newest'"):
        load_farm(_farm(tree, 'cuda = "13.0"\narchs = "120"\ntorch = "2.14.1"\ntorch-newest = 2\n'))


def test_archs_where_supported_trims_per_cuda(tree: Path) -> None:
    body = 'cuda = ["12.8", "13.0"]\narchs = "90,100,121"\nplatforms = "aarch64"\n'  # DGX Spark: an Arm machine
    with pytest.raises(FarmError, match="combines CUDA 12.8 with archs 90,100,121: .*cannot compile sm_121") as info:
        expand(load_farm(_farm(tree, body)), _settings(tree), releases=_releases)
    assert "archs-where-supported = true" in (info.value.hint or "")
    targets = expand(load_farm(_farm(tree, body + "archs-where-supported = true\n")), _settings(tree),
                     releases=_releases)
    assert {str(t.cuda): format_arch_list(t.archs) for t in targets} == {"12.8": "90,100", "13.0": "90,100,121"}


def test_watch_lists_torch_not_built_and_new_toolkits(fixture_index: tuple[str, list[str]], tree: Path) -> None:  # noqa: F811
    url, _ = fixture_index
    settings = _settings(tree, offline=False)
    farm = load_farm(_farm(tree, f'cuda = ["13.0", "13.2"]\narchs = "120"\ntorch-index = "{url}/simple"\n'))
    rows = {r.cuda: r for r in watch_torch(farm, settings) if r.index == "custom"}
    assert rows["13.0"].unbuilt == ("3.5.0",) and rows["13.2"].unbuilt == ("3.2.0",)
    house = tree / "wheelhouse"
    (house / "wheels").mkdir(parents=True)
    (house / "records").mkdir()
    name = "demo-1.0+cu130torch3.5-cp312-cp312-linux_x86_64.whl"
    (house / "wheels" / name).write_bytes(b"not really a wheel")
    (house / "records" / f"{name}.json").write_text(json.dumps(
        {"package": "demo", "version": "1.0", "cuda": "13.0", "torch_index": f"{url}/simple",
         "python": {"version": "3.12.3", "torch": "3.5.0"}}))
    rows = {r.cuda: r for r in watch_torch(farm, settings) if r.index == "custom"}
    assert rows["13.0"].built == ("3.5.0",) and rows["13.0"].unbuilt == () and rows["13.0"].note == "up to date"
    assert rows["13.2"].unbuilt == ("3.2.0",) and rows["13.2"].in_farm
    assert "12.8" not in rows  # 3.1.0 is not among the index's two newest minors: an old line, not reported
    toolkits = [r for r in watch_torch(farm, settings) if r.index == "cuda-toolkit"]
    assert toolkits and all(r.cuda not in ("13.0", "13.2") and not r.in_farm for r in toolkits)
