"""Claimed, installable, GPU-evidenced (issue 39): the root farm.toml's cells judged by farm/proven.py against the
shipped torch snapshots (offline), with every target planned by the real recipes (tests/test_farm_proof.py's
settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.discovery.compat import known_indexes
from builder.farm.coverage import USERS_PLATFORMS, users_matrix
from builder.farm.expand import expand
from builder.farm.facts import torch_triton
from builder.farm.proven import ALL, PYPI, cell_releases, prove_farm
from builder.farm.served import Cell
from builder.farm.spec import load_farm
from builder.model.abi import per_torch_requirement
from builder.model.records import BuildRecord
from builder.pipeline import promote
from tests.test_farm_proof import RELEASES, ROOT, planning_settings, root_targets

NEWEST = {"causal-conv1d": "1.7.0", "mamba-ssm": "2.3.2.post1", "fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}


@pytest.fixture(scope="module")
def proofs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    settings = planning_settings(tmp_path_factory.mktemp("proof"))
    found = prove_farm(load_farm(ROOT / "farm.toml", settings), root_targets(settings), settings)
    return {(p.package, p.version): p for p in found}


def test_every_torch_release_of_the_users_matrix_has_its_triton_pin_read(tmp_path: Path) -> None:
    """The triton pins are read from each release's METADATA (farm/facts.py torch_triton, from the snapshot): a
    release of the users' matrix without one would lose its triton check."""
    releases = cell_releases(known_indexes(planning_settings(tmp_path)), USERS_PLATFORMS)
    seen = {r for found in releases.values() for r in found}
    pins = torch_triton()
    assert seen and sorted(seen - set(pins)) == []
    # read, not kept by hand: torch 2.12.1 pins triton 3.7.1 (the old hand table said 3.7.0), 2.15.0 `~=3.9.0`
    assert pins["2.12.1"] == "3.7.1" and pins["2.15.0"] == "3.9.0" and pins["2.8.0"] == "3.4.0"


def test_a_per_torch_wheel_takes_every_patch_release_of_its_minor() -> None:
    from packaging.requirements import Requirement

    pin = per_torch_requirement("2.9.1")
    assert pin == "torch>=2.9.0,<2.10"
    spec = Requirement(pin).specifier
    assert spec.contains("2.9.0") and spec.contains("2.9.1") and not spec.contains("2.10.0")
    record = BuildRecord(package="x", version="1", cuda="12.8", python={"version": "3.12.1", "torch": "2.9.1"})
    assert promote._torch_pin((pin,), record) == "2.9.1"  # builder test installs the torch it was built with


def test_every_claimed_cell_of_the_newest_releases_installs(proofs: dict) -> None:
    """After the fixes of issue 39 nothing the farm claims for the newest releases fails to install beside its torch,
    except the pure-Python wheels' Python 3.9 cells (fla requires Python >= 3.10: claimed, not installable)."""
    for package, version in NEWEST.items():
        view = proofs[package, version].view(ALL)
        lost = view.claimed - view.installable
        if package.startswith("fla") or package == "flash-linear-attention":
            assert lost and {c.python for c in lost} == {"3.9"}
            assert f"Python 3.9: {package} requires Python >=3.10" in view.reasons
        else:
            assert lost == frozenset(), (package, [r for r, c in view.reasons.items() if c & lost])


def test_the_counts_claimed_installable_evidenced(proofs: dict) -> None:
    counts = {(p, view): proofs[p, NEWEST[p]].view(view).counts() for p in NEWEST for view in (ALL, PYPI)}
    # issue 51: each platform's CUDA as its wheels say: PyPI's aarch64 torch has CUDA from 2.11.0 (65 PyPI cells,
    # not 75); the channels' aarch64 wheels were not read where the snapshot was written (75 cells unknown, not
    # counted: no phantom cell)
    assert counts["causal-conv1d", ALL] == {"cells": 125, "claimed": 122, "installable": 122, "evidenced": 0,
                                            "unknown": 75}
    assert counts["mamba-ssm", ALL] == {"cells": 125, "claimed": 110, "installable": 110, "evidenced": 0,
                                        "unknown": 75}
    assert counts["fla-core", ALL] == {"cells": 125, "claimed": 125, "installable": 122, "evidenced": 97,
                                       "unknown": 75}
    assert counts["causal-conv1d", PYPI] == {"cells": 65, "claimed": 64, "installable": 64, "evidenced": 0,
                                             "unknown": 0}
    conv = proofs["causal-conv1d", "1.7.0"].view(ALL).reasons
    # a test job per arch a runner has: the x86_64 wheels run on gpu-sm120-x86_64 and gpu-sm90-x86_64, so only
    # sm_100 is kernel-untested there; no aarch64 runner at all
    assert len(conv["planned, kernel-untested on sm_100 (runners: gpu-sm120-x86_64, gpu-sm90-x86_64 only)"]) > 0
    assert any(r.startswith("no GPU runner for aarch64") for r in conv)
    mamba = proofs["mamba-ssm", "2.3.2.post1"].view(ALL).reasons
    assert len(mamba["torch 2.8.0 pins triton 3.4.0: mamba-ssm requires triton>=3.5.0"]) == 10  # x86_64 (aarch64 unknown)
    # the previous release: its stable wheels (0004 covers 2.3.1) ask triton with no version (farm/facts.py), so
    # every claimed cell installs; it counted none while its requirements were not recorded
    previous = proofs["mamba-ssm", "2.3.1"].view(ALL)
    assert len(previous.claimed) == 70 and previous.installable == previous.claimed  # 45 x86_64, 25 aarch64
    from builder.farm.facts import wheel_facts

    assert wheel_facts("mamba-ssm", "2.2.6.post3") is None  # an unrecorded release would count nothing installable


def test_pypi_publishes_no_aarch64_cuda_torch_before_2_11(tmp_path: Path) -> None:
    """Read from the wheels (issue 51): PyPI's aarch64 torch 2.9.0, 2.9.1 and 2.10.0 are CPU builds, as 2.8's."""
    indexes = known_indexes(planning_settings(tmp_path))
    pypi, _ = users_matrix([i for i in indexes if i.name == "pypi"])
    every, notes = users_matrix(indexes)
    for minor in ("2.8", "2.9", "2.10"):
        assert not {c for c in pypi if c.platform == "aarch64" and c.torch == minor}
        assert Cell(minor, "12.8", "3.12", "x86_64") in pypi
    assert Cell("2.11", "13.0", "3.12", "aarch64") in pypi
    # the channels' aarch64 wheels were not read (release-notes rows): unknown, not counted, and said so
    assert not {c for c in every if c.platform == "aarch64" and c.cuda.startswith("12.")}
    assert any(n.startswith("pytorch-cu128 aarch64: the CUDA of torch") for n in notes)


def test_a_claimed_cell_that_cannot_install_is_shown_with_its_reason(tmp_path: Path) -> None:
    """The check can fail: mamba-ssm 2.3.2.post1 for torch 2.8 (triton 3.4) is claimed and not installable."""
    settings = planning_settings(tmp_path)
    farm_file = tmp_path / "farm.toml"
    farm_file.write_text(f'[defaults]\ncuda = ["12.8"]\npython = "3.12"\nrecipes = "{ROOT / "recipes"}"\n'
                         'torch-index = "cu128"\ntorch = ["2.8.0", "2.9.1"]\narchs-where-supported = true\n'
                         '[[package]]\nname = "mamba-ssm"\nversions = ["2.3.2.post1"]\n')
    farm = load_farm(farm_file, settings)
    targets = expand(farm, settings, releases=lambda name, s: RELEASES[name])
    (proof,) = prove_farm(farm, targets, settings)
    view = proof.view(ALL)
    bad = view.reasons["torch 2.8.0 pins triton 3.4.0: mamba-ssm requires triton>=3.5.0"]
    assert Cell("2.8", "12.8", "3.12", "x86_64") in bad and Cell("2.8", "12.8", "3.12", "x86_64") in view.claimed
    assert Cell("2.9", "12.8", "3.12", "x86_64") in view.installable  # 2.9.0 and 2.9.1 both: the minor's pin
