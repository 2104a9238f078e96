"""Issue 51: the facts coverage counts with are checked against their source, PyPI's own files.

- ``network`` (the integration tier): the shipped snapshot's platform facts are what the wheels say when read
  again now (a wheel never changes, so this holds next month too), and each recorded package's Requires-Python
  (farm/facts.py ``WHEEL_FACTS``) is what PyPI's metadata of that release says.
- ``drift`` only (scripts/drift-check.sh, nightly, non-gating): every final torch release PyPI lists now is in the
  snapshot, or the report says to write it again (``builder torch-table --write-snapshot``).
"""

from __future__ import annotations

import json

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.core import net
from builder.discovery.classify import classify
from builder.discovery.simpleindex import project_files
from builder.discovery.torchindex import MIN_TORCH, PYPI_SIMPLE, load_snapshot, now_stamp
from builder.farm.facts import WHEEL_FACTS

READ_AGAIN = ("2.10.0", "2.11.0", "2.15.0")  # the last CPU-only aarch64 release, the first CUDA one, the newest


@pytest.fixture(scope="module")
def torch_files() -> dict[str, list]:
    by_version: dict[str, list] = {}
    for wheel in project_files(PYPI_SIMPLE, "torch"):
        version = parse_wheel_filename(wheel.filename)[1]
        by_version.setdefault(str(version), []).append(wheel)
    return by_version


@pytest.mark.network
@pytest.mark.parametrize("version", READ_AGAIN)
def test_the_snapshots_platform_facts_are_what_the_wheels_say(torch_files: dict, version: str) -> None:
    shipped = load_snapshot()[PYPI_SIMPLE].release(version)
    assert shipped is not None and shipped.platforms
    live = classify(version, torch_files[version], now_stamp())
    for facts in shipped.platforms:
        again = live.on(facts.platform)
        assert again is not None, (version, facts.platform)
        assert (again.cuda, again.triton, again.wheel, again.sha256) == (
            facts.cuda, facts.triton, facts.wheel, facts.sha256), (version, facts.platform)


@pytest.mark.network
@pytest.mark.parametrize("facts", WHEEL_FACTS, ids=lambda f: f"{f.package}{f.versions}")
def test_each_recorded_requires_python_is_pypis(facts) -> None:
    """WHEEL_FACTS is kept by hand: each release it names must say the same on PyPI (the Requires-Python its
    simple page gives each file, PEP 691)."""
    page = json.loads(net.fetch_bytes(f"{PYPI_SIMPLE}/{facts.package}/",
                                      headers={"Accept": "application/vnd.pypi.simple.v1+json"}))
    checked = 0
    for file in page["files"]:
        name = file["filename"]
        version = name.removesuffix(".tar.gz").rsplit("-", 1)[-1] if name.endswith(".tar.gz") else (
            str(parse_wheel_filename(name)[1]) if name.endswith(".whl") else None)
        if version is None or not facts.versions.contains(Version(version), prereleases=True):
            continue
        said = SpecifierSet(file.get("requires-python") or "")
        assert said == facts.requires_python, (facts.package, name, str(said))
        checked += 1
    assert checked, f"{facts.package} {facts.versions}: no such release on PyPI"


@pytest.mark.drift
@pytest.mark.network
def test_every_final_torch_release_on_pypi_is_in_the_snapshot(request: pytest.FixtureRequest) -> None:
    if "drift" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("runs in the drift check (scripts/drift-check.sh): the newest torch releases on PyPI")
    known = {r.version for r in load_snapshot()[PYPI_SIMPLE].releases}
    listed = {str(Version(parse_wheel_filename(w.filename)[1].public)) for w in project_files(PYPI_SIMPLE, "torch")}
    new = sorted((v for v in listed if v not in known and not Version(v).is_prerelease
                  and not Version(v).is_devrelease and Version(v) >= MIN_TORCH), key=Version)
    assert not new, (f"torch {', '.join(new)} on PyPI is not in the shipped snapshot: run "
                     "`builder torch-table --write-snapshot` and commit builder/discovery/data/torch-snapshot.json")
