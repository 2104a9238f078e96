"""The farm's ABI axis (issue 25): where a recipe's [stable-abi] port covers a version, the (CUDA × torch × Python)
cells at or above the port's torch floor collapse into one torch-stable target per CUDA major and arch list; cells
below the floor stay per-torch; ``abi = "per-torch"`` opts out; ``builder matrix`` counts compiles and the
(torch minor, CUDA line, Python) cells they serve.

No compiling and no network: the recipes are written here, PyPI's release lists are injected (or cached for the
CLI, which runs offline), and the torch index is a listing written into the test's own cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.settings import Settings
from builder.discovery.compat import PYPI_SIMPLE, resolve_index
from builder.discovery.torchindex import cache_file
from builder.farm.coverage import users_matrix
from builder.farm.expand import expand
from builder.farm.ghmatrix import github_matrix
from builder.farm.served import Cell, coverage, served_cells, serving, summary
from builder.farm.spec import FarmError, load_farm
from builder.model.arch import format_arch_list
from tests.helpers import PURE_RECIPE, run_cli, write_recipes

STABLE = """
name = "stabledemo"
kind = "cuda-extension"
versions = ">=1.0,<2"
[source]
pypi = "stabledemo"
[stable-abi]
versions = ">=1.4"
torch-floor = "2.11"
namespaces = ["stabledemo_cuda"]
[test]
imports = ["stabledemo"]
"""

PLAIN = """
name = "plaindemo"
kind = "cuda-extension"
versions = ">=1.0,<2"
[source]
pypi = "plaindemo"
"""

RELEASES = {"stabledemo": ["1.1", "1.4"], "plaindemo": ["1.0"], "puredemo": ["0.2"]}

PY_10_14 = ["3.10", "3.11", "3.12", "3.13", "3.14", "3.14t"]
# The torch index of these tests (PyPI's URL, read from the test's cache): one torch below the floor on CUDA 13.0
# (2.10.1), two releases of 2.12 whose Pythons differ, and CUDA 13.2 with newer Pythons.
TORCH = [
    ("2.9.1", "12.8", ["3.10", "3.11", "3.12", "3.13"]),
    ("2.10.0", "12.8", PY_10_14),
    ("2.10.1", "13.0", PY_10_14),
    ("2.11.0", "13.0", PY_10_14),
    ("2.12.0", "13.0", ["3.9", "3.10", "3.11", "3.12", "3.13"]),
    ("2.12.1", "13.0", PY_10_14),
    ("2.13.0", "13.0", PY_10_14),
    ("2.14.0", "13.2", ["3.11", "3.12", "3.13", "3.14", "3.15", "3.15t"]),
]

FARM = """
[defaults]
recipes = "recipes"
cuda = ["12.8", "13.0", "13.2"]
archs = "90,120"
python = ["3.11", "3.12"]
torch-newest = 2

[[package]]
name = "stabledemo"
newest = 2
"""


def _write_torch_index(settings: Settings) -> None:
    releases = [{"version": v, "cuda": c, "pythons": p, "evidence": "test", "read_at": "2026-12-01T00:00:00Z"}
                for v, c, p in TORCH]
    cache_file(settings, PYPI_SIMPLE).write_text(json.dumps(
        {"name": "pypi", "url": PYPI_SIMPLE, "read_at": "2026-12-01T00:00:00Z", "note": "", "releases": releases}))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_recipes(tmp_path, {"stabledemo": STABLE, "plaindemo": PLAIN, "puredemo": PURE_RECIPE})
    (tmp_path / "patches").mkdir()
    _write_torch_index(settings_for(tmp_path))
    return tmp_path


def settings_for(tree: Path) -> Settings:
    return Settings.from_env({}, cache_dir=tree / "cache", wheelhouse=tree / "wheelhouse",
                             recipes_dir=tree / "recipes", offline=True)


def targets_of(tree: Path, text: str) -> list:
    path = tree / "farm.toml"
    path.write_text(text)
    settings = settings_for(tree)
    return expand(load_farm(path, settings), settings, releases=lambda name, s: RELEASES[name])


def rows(targets: list) -> list[tuple[str, ...]]:
    return [(t.version, str(t.cuda), str(t.python), t.torch, str(t.abi)) for t in targets]


# ---------------------------------------------------------------- expansion


def test_port_collapses_the_cells_of_a_cuda_major_into_one_stable_target(tree: Path) -> None:
    targets = targets_of(tree, FARM)
    assert rows(targets) == [
        # 1.4 (the port covers it): CUDA 12.8's torches (2.10, 2.9) are below the floor: per-torch, one per Python
        ("1.4", "12.8", "3.11", "2.10.0", "per-torch"),
        ("1.4", "12.8", "3.11", "2.9.1", "per-torch"),
        ("1.4", "12.8", "3.12", "2.10.0", "per-torch"),
        ("1.4", "12.8", "3.12", "2.9.1", "per-torch"),
        # CUDA 13.0 (2.13.0, 2.12.1) and 13.2 (2.14.0) × 2 Pythons: one target, in the place of the first of them,
        # built on the oldest 13.x line with the plan's torch (the floor minor's newest release) and the first Python
        ("1.4", "13.0", "3.11", "2.11.0", "torch-stable"),
        # 1.1 is outside the port's versions: every cell per-torch
        *[("1.1", cuda, py, torch, "per-torch") for cuda, torches in (("12.8", ("2.10.0", "2.9.1")),
                                                                       ("13.0", ("2.13.0", "2.12.1")),
                                                                       ("13.2", ("2.14.0",)))
          for py in ("3.11", "3.12") for torch in torches],
    ]
    stable = targets[4]
    assert stable.id == "stabledemo-1.4-cu13-abi3-sm90_120-x86_64"
    assert stable.stable and stable.port is not None and stable.port.floor_text == "2.11"
    assert format_arch_list(stable.archs) == "90,120"
    ids = [t.id for t in targets]
    assert len(set(ids)) == len(ids) == 15
    assert ids[0] == "stabledemo-1.4-cu128-sm90_120-x86_64-py3.11-torch2.10.0"  # per-torch ids as before
    # what `builder build` gets: the stable target asks for the stable ABI, the others for per-torch explicitly
    assert stable.to_target(1).abi == "torch-stable" and stable.to_target(1).torch == "2.11.0"
    assert {t.to_target(1).abi for t in targets if not t.stable} == {"per-torch"}
    # its wheel (+cu13, cp310-abi3) cannot collide with a per-torch wheel
    assert len({t.wheel_identity for t in targets}) == len(targets)


def test_below_floor_torches_of_the_same_cuda_major_stay_per_torch(tree: Path) -> None:
    text = FARM.replace("torch-newest = 2", 'torch = ["2.10.1", "2.13.0"]').replace(
        'cuda = ["12.8", "13.0", "13.2"]', 'cuda = "13.0"').replace("newest = 2", 'versions = ["1.4"]')
    targets = targets_of(tree, text)
    assert rows(targets) == [
        ("1.4", "13.0", "3.11", "2.10.1", "per-torch"),
        ("1.4", "13.0", "3.11", "2.11.0", "torch-stable"),  # stands for 2.13.0 × 3.11 and 3.12
        ("1.4", "13.0", "3.12", "2.10.1", "per-torch"),
    ]
    # a Python below abi3's floor (3.10) is no stable cell either (2.12.0 has 3.9 wheels); a torch without wheels
    # for a Python of the list (2.10.1 and 3.9) is no cell at all, and no target
    text = text.replace('torch = ["2.10.1", "2.13.0"]', 'torch = ["2.10.1", "2.12.0"]')
    targets = targets_of(tree, text.replace('python = ["3.11", "3.12"]', 'python = ["3.9", "3.12"]'))
    assert [(str(t.python), t.torch, str(t.abi)) for t in targets] == [
        ("3.9", "2.12.0", "per-torch"), ("3.12", "2.10.1", "per-torch"), ("3.12", "2.11.0", "torch-stable")]


def test_exclusions_apply_to_cells_before_they_collapse(tree: Path) -> None:
    text = FARM + '[[exclude]]\npackage = "stabledemo"\ncuda = "13.0"\n'
    targets = [t for t in targets_of(tree, text) if t.version == "1.4"]
    # only CUDA 13.2's cells are left for the major: the stable target is built on 13.2, with its floor torch
    (stable,) = [t for t in targets if t.stable]
    assert (str(stable.cuda), stable.torch, stable.id) == ("13.2", "2.14.0", "stabledemo-1.4-cu13-abi3-sm90_120-x86_64")
    text = FARM + '[[exclude]]\npackage = "stabledemo"\ncuda = "13.0"\n[[exclude]]\npackage = "stabledemo"\ncuda = "13.2"\n'
    assert not [t for t in targets_of(tree, text) if t.stable]


@pytest.mark.parametrize("where", ["package", "defaults"])
def test_abi_per_torch_opts_out(tree: Path, where: str) -> None:
    text = (FARM + 'abi = "per-torch"\n' if where == "package"
            else FARM.replace("torch-newest = 2", 'torch-newest = 2\nabi = "per-torch"'))
    targets = targets_of(tree, text)
    assert len(targets) == 20 and {str(t.abi) for t in targets} == {"per-torch"}
    # the port is still known (the GitHub matrix passes --abi per-torch, since --abi auto would pick stable)
    assert all(t.port is not None for t in targets if t.version == "1.4")
    assert {e["abi"] for e in github_matrix(load_farm(tree / "farm.toml"), targets)["include"]
            if e["version"] == "1.4"} == {"per-torch"}


def test_unknown_abi_is_refused_with_file_field_and_cure(tree: Path) -> None:
    path = tree / "farm.toml"
    path.write_text(FARM + 'abi = "stable"\n')
    with pytest.raises(FarmError) as info:
        load_farm(path)
    assert f"{path}: field 'package[0].abi' is 'stable'" in info.value.message
    assert "torch-stable" in (info.value.hint or "")
    path.write_text(FARM.replace("[defaults]", '[defaults]\nabi = "abi3"'))
    with pytest.raises(FarmError) as info:
        load_farm(path)
    assert "field 'defaults.abi' is 'abi3'" in info.value.message
    assert "auto, per-torch, torch-stable" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        # 1.1 is outside the port's versions
        (lambda t: t.replace('cuda = ["12.8", "13.0", "13.2"]', 'cuda = "13.0"') + 'abi = "torch-stable"\n',
         "field 'package[0].abi' is 'torch-stable', but stabledemo 1.1 is not covered by its stable-ABI port (>=1.4)"),
        # CUDA 12.8's torches are below the floor
        (lambda t: t.replace('"stabledemo"\nnewest = 2', '"stabledemo"\nversions = ["1.4"]\nabi = "torch-stable"'),
         "but target stabledemo-1.4-cu128-sm90_120-x86_64-py3.11-torch2.10.0 cannot be: torch 2.10.0 is below the port's "
         "floor 2.11"),
        (lambda t: t.replace('name = "stabledemo"\nnewest = 2', 'name = "plaindemo"\nabi = "torch-stable"'),
         "plaindemo 1.0 has no stable-ABI port"),
        (lambda t: t.replace('name = "stabledemo"\nnewest = 2', 'name = "puredemo"\nabi = "torch-stable"'),
         "puredemo 0.2 is a pure-Python recipe"),
    ],
)
def test_abi_torch_stable_refuses_a_cell_that_cannot_be_stable(tree: Path, edit, needle: str) -> None:
    with pytest.raises(FarmError) as info:
        targets_of(tree, edit(FARM))
    assert needle in info.value.message, info.value.one_line()


def test_two_entries_of_one_stable_wheel_fold_into_one_compile(tree: Path) -> None:
    """Issue 39: a second entry whose cells cross the floor into the same +cu13 wheel (here: Python 3.13 on 13.0) adds
    no compile; the one kept is built on the older CUDA line of the two (13.0, not the first entry's 13.2), so it
    serves both entries' cells."""
    first = FARM.replace('"stabledemo"\nnewest = 2', '"stabledemo"\nversions = ["1.4"]\ncuda = "13.2"')
    alone = targets_of(tree, first)
    assert [(str(t.cuda), t.torch, str(t.abi)) for t in alone] == [("13.2", "2.14.0", "torch-stable")]
    both = targets_of(tree, first + '[[package]]\nname = "stabledemo"\nversions = ["1.4"]\npython = "3.13"\n'
                      'cuda = "13.0"\n')
    stable = [t for t in both if t.stable]
    assert len(stable) == 1 and str(stable[0].cuda) == "13.0" and stable[0].entry == "package[0]"
    assert stable[0].id == "stabledemo-1.4-cu13-abi3-sm90_120-x86_64"
    universe = universe_of(tree)
    served = served_cells(stable[0], resolve_index(None, settings_for(tree)), universe)
    assert Cell("2.11", "13.0", "3.13") in served and Cell("2.14", "13.2", "3.12") in served
    assert len(both) == 1  # the second entry's torches (2.13.0, 2.12.1) are all at or above the floor


def test_stable_targets_of_two_entries_with_other_arch_lists_still_clash(tree: Path) -> None:
    text = FARM.replace('"stabledemo"\nnewest = 2', '"stabledemo"\nversions = ["1.4"]') + \
        '[[package]]\nname = "stabledemo"\nversions = ["1.4"]\ncuda = "13.0"\narchs = "90"\n'
    with pytest.raises(FarmError, match=r"would publish the same wheel file as stabledemo-1.4-cu13-abi3-sm90_120"):
        targets_of(tree, text)


# ---------------------------------------------------------------- what the targets serve


def universe_of(tree: Path) -> frozenset[Cell]:
    """The users' matrix of this test's torch index alone (farm/coverage.users_matrix), x86_64."""
    return users_matrix([resolve_index(None, settings_for(tree))], platforms=["x86_64"])[0]


def test_served_cells_of_stable_and_per_torch_targets(tree: Path) -> None:
    targets = targets_of(tree, FARM)
    index, universe = resolve_index(None, settings_for(tree)), universe_of(tree)
    assert served_cells(targets[0], index, universe) == {Cell("2.10", "12.8", "3.11")}
    stable = served_cells(targets[4], index, universe)
    # torch >= 2.11 on 13.0 and 13.2 × their Pythons >= 3.10, free-threaded builds left out (they load no abi3);
    # 2.12's Pythons are those of 2.12.0 and 2.12.1 together; 2.10.1 (13.0) is below the floor
    expected = {Cell(t, "13.0", p) for t in ("2.11", "2.12", "2.13") for p in ("3.10", "3.11", "3.12", "3.13", "3.14")}
    expected |= {Cell("2.14", "13.2", p) for p in ("3.11", "3.12", "3.13", "3.14", "3.15")}
    assert stable == expected and len(stable) == 20
    # built on 13.2, the wheel is not claimed for the older 13.0 runtime
    text = FARM + '[[exclude]]\npackage = "stabledemo"\ncuda = "13.0"\n'
    (on_132,) = [t for t in targets_of(tree, text) if t.stable]
    assert {c.cuda for c in served_cells(on_132, index, universe)} == {"13.2"}
    # the users' matrix decides, whichever index a torch comes from: a channel's 13.0 build of 2.14 is a cell the
    # stable wheel built on 13.0 serves (as PyTorch's cu130 channel has 2.15 while PyPI's 2.15 is a 13.2 build)
    stable_130 = targets[4]
    assert Cell("2.14", "13.0", "3.12") not in stable
    assert Cell("2.14", "13.0", "3.12") in served_cells(stable_130, index, universe | {Cell("2.14", "13.0", "3.12")})
    assert Cell("2.14", "12.9", "3.12") not in served_cells(stable_130, index, universe | {Cell("2.14", "12.9", "3.12")})


def test_matrix_counts_compiles_and_cells(tree: Path) -> None:
    text = FARM + '[[package]]\nname = "puredemo"\ncuda = "13.0"\ntorch-newest = 1\npython = "3.12"\n'
    targets = targets_of(tree, text)
    covered = coverage(targets, serving(targets, settings_for(tree), universe_of(tree)))
    by_version = {(c.package, c.version): (len(c.targets), c.compiles, c.stable, len(c.cells)) for c in covered}
    assert by_version == {
        ("stabledemo", "1.4"): (5, 5, 1, 4 + 20),  # 4 per-torch cells (12.8) and the stable target's 20
        ("stabledemo", "1.1"): (10, 10, 0, 10),
        ("puredemo", "0.2"): (1, 0, 0, 35),  # one py3-none-any wheel: every cell of the users' matrix
    }
    assert summary(covered) == {"targets": 16, "compiles": 15, "stable_compiles": 1, "per_torch_compiles": 14,
                                "pure_python_builds": 1, "cells_served": 69, "compiled_cells_served": 34,
                                "cells_served_x86_64": 69}
    # before: every target per-torch (abi = "per-torch" everywhere): more compiles, fewer cells
    before = targets_of(tree, text.replace("torch-newest = 2", 'torch-newest = 2\nabi = "per-torch"'))
    totals = summary(coverage(before, serving(before, settings_for(tree), universe_of(tree))))
    assert (totals["compiles"], totals["stable_compiles"], totals["cells_served"]) == (20, 0, 20 + 35)


# ---------------------------------------------------------------- builder matrix


def _cli_tree(tree: Path) -> dict[str, str]:
    """The CLI runs offline: PyPI's release lists cached as resolve.pypi_releases caches them."""
    index = tree / "cache" / "index"
    for name, versions in RELEASES.items():
        files = {v: [{"packagetype": "sdist", "url": f"https://files.example/{name}-{v}.tar.gz",
                      "filename": f"{name}-{v}.tar.gz", "digests": {"sha256": "0" * 64}}] for v in versions}
        (index / f"{name}.json").write_text(json.dumps({"releases": files}))
    (tree / "farm.toml").write_text(FARM)
    return {"BUILDER_CACHE_DIR": str(tree / "cache"), "BUILDER_WHEELHOUSE": str(tree / "wheelhouse"),
            "BUILDER_OFFLINE": "1"}


def test_matrix_cli_prints_compiles_and_cells_table_json_and_github(tree: Path) -> None:
    env = _cli_tree(tree)
    farm = str(tree / "farm.toml")
    table = run_cli("matrix", "--file", farm, "--details", env=env)
    assert table.code == 0, table.stderr
    assert "15 targets" in table.stdout and "stable >=2.11" in table.stdout
    assert "compiles needed: 15 (1 stable-ABI, 14 per-torch), plus 0 pure-Python builds" in table.stdout
    # the users' matrix is builder coverage's: this test's PyPI listing and the shipped snapshots of PyTorch's
    # channels (whose 13.0 builds of 2.14 the stable wheel serves too, on x86_64: the farm builds no aarch64)
    data = json.loads(run_cli("matrix", "--file", farm, "--format", "json", env=env).stdout)
    assert data["summary"]["compiles"] == 15 and data["summary"]["matrix_cells"] > 34
    stable = [t for t in data["targets"] if t["abi"] == "torch-stable"]
    assert [t["id"] for t in stable] == ["stabledemo-1.4-cu13-abi3-sm90_120-x86_64"] and stable[0]["cells_served"] >= 20
    newest = data["packages"][0]
    assert newest["cells"][0] == ["2.9", "12.8", "3.11", "x86_64"]
    # the per-torch 12.8 wheels of 2.9 and 2.10 (below the port's 2.11: +cu12torch2.9, +cu12torch2.10, 2 Pythons
    # each) serve the cu129 channel's 2.9 and 2.10 (the shipped snapshot) too: 4 cells more than while a per-torch
    # label named its CUDA line
    per_torch = {tuple(c) for c in newest["cells"] if c[1].startswith("12.")}
    assert {c[:2] for c in per_torch} == {(t, line) for t in ("2.9", "2.10") for line in ("12.8", "12.9")}
    assert newest["cells_served"] == len(per_torch) + stable[0]["cells_served"] == newest["farm_serves"]
    assert sum(newest["not_served"].values()) == newest["matrix_cells"] - newest["farm_serves"]
    assert (f"stabledemo 1.4: farm targets serve {newest['farm_serves']} of {data['summary']['matrix_cells']} cells"
            in table.stdout)
    assert f"cells served by the farm: {data['summary']['cells_served']}" in table.stdout
    github = json.loads(run_cli("matrix", "--file", farm, "--format", "github", env=env).stdout)
    entry = next(e for e in github["include"] if e["id"] == "stabledemo-1.4-cu13-abi3-sm90_120-x86_64")
    # what `builder build` needs, and the GPU runner by arch as for any target
    assert {k: entry[k] for k in ("cuda", "python", "torch", "abi", "runner")} == {
        "cuda": "13.0", "python": "3.11", "torch": "2.11.0", "abi": "torch-stable", "runner": "gpu-sm120-x86_64"}
    assert all(isinstance(v, str) for e in github["include"] for v in e.values())
    # the farm's decision where the recipe's port covers the version (`builder build --abi auto` could pick
    # either); "auto" elsewhere, so the workflow always passes --abi
    by_version: dict[str, set[str]] = {}
    for e in github["include"]:
        by_version.setdefault(e["version"], set()).add(e["abi"])
    assert by_version["1.4"] == {"per-torch", "torch-stable"}
    assert all(abis == {"auto"} for version, abis in by_version.items() if version != "1.4")
