"""Issue 55 items 3 and 6: what ``builder install`` checks on a wheel it builds (the env's torch by default, the rest
of the torch range with --torch-range, said in the dry run), and what it says when there is no wheelhouse where it
looked (outside the project folder) instead of compiling a wheel the project's wheelhouse already has."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.cli.main import build_parser
from builder.core.errors import InstallError
from builder.core.settings import Settings
from builder.index.store import Wheelhouse
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord
from builder.pipeline.run import BuildOptions
from builder.user import install as install_module
from builder.user.choice import Choice
from builder.user.fit import EnvFacts
from builder.user.install import InstallOutcome, InstallRequest, missing_wheelhouse, planned_builds
from builder.user.wheelhouse import WheelhouseReader, project_wheelhouse
from tests.test_index import labelled_wheel

TAGS = frozenset({"cp312-cp312-linux_x86_64", "py3-none-any", "cp312-none-any"})
ENV = EnvFacts(python="3.12.1", tags=TAGS, torch="2.14.1", torch_cuda="13.0", gpus=(120,))


class Builds13:
    """A machine that compiles CUDA 13 (what install asks before it builds)."""

    def can_build(self, cuda: CudaVersion, platform: object = None) -> tuple[bool, str]:
        return cuda.major == 13, "host nvcc 13.0"


def request(tmp_path: Path, **kw: object) -> InstallRequest:
    return InstallRequest(packages=("fla-core",), python=Path("/env/bin/python"), source=str(tmp_path / "wh"),
                          **kw)  # type: ignore[arg-type]


def test_the_dry_run_builds_check_the_envs_torch_only_unless_torch_range(tmp_path: Path) -> None:
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    missing = [Choice("fla-core", (), None)]
    plain = planned_builds(missing, ENV, "3.12", Builds13(), request(tmp_path, dry_run=True), settings)  # type: ignore[arg-type]
    assert plain == ("builder build fla-core --cuda 13.0 --python 3.12 --torch 2.14.1 --no-torch-range",)
    whole = planned_builds(missing, ENV, "3.12", Builds13(),  # type: ignore[arg-type]
                           request(tmp_path, dry_run=True, torch_range=True), settings)
    assert whole == ("builder build fla-core --cuda 13.0 --python 3.12 --torch 2.14.1",)
    lines = InstallOutcome(Path("/env/bin/python"), (), (), None, "2.14.1", {}, plain,
                           install_module.build_checks("2.14.1", False)).summary()
    assert lines[1] == ("each build checks its wheel beside your torch 2.14.1 only; --torch-range also checks it "
                        "beside the other torches of its range (a fresh venv and a torch download, GBs, each)")


@dataclass
class Built:
    status: str = "built"
    wheel: str = "fla_core-0.6.0+cu130torch2.14-py3-none-any.whl"


@pytest.mark.parametrize("torch_range", [False, True])
def test_a_build_started_by_install_runs_the_range_checks_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], torch_range: bool) -> None:
    given: list[BuildOptions] = []
    monkeypatch.setattr(install_module, "run_build", lambda target, settings, options: given.append(options) or Built())
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    built = install_module._build_missing([Choice("fla-core", (), None)], ENV, "3.12", Builds13(),  # type: ignore[arg-type]
                                          request(tmp_path, torch_range=torch_range), settings)
    assert built == ["fla-core"] and [o.torch_range for o in given] == [torch_range]
    said = capsys.readouterr()
    assert "beside your torch 2.14.1" in said.out + said.err


def test_install_takes_torch_range_as_an_opt_in_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["install", "fla-core"]).torch_range is False
    assert parser.parse_args(["install", "fla-core", "--torch-range"]).torch_range is True


def house_with_causal_conv1d(root: Path, tmp_path: Path) -> Path:
    house = Wheelhouse(root)
    house.publish(labelled_wheel(tmp_path, "causal-conv1d", "1.7.0", "cu130torch2.14", pins=("torch==2.14.1",)),
                  BuildRecord.from_json({}))
    return root


def test_the_project_wheelhouse_is_the_checkouts_and_none_for_a_packaged_builder(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "wheelhouse").mkdir(parents=True)
    assert project_wheelhouse(checkout, tmp_path / "no-data") is None  # only its README: no index yet
    house_with_causal_conv1d(checkout / "wheelhouse", tmp_path)
    assert project_wheelhouse(checkout, tmp_path / "no-data") == checkout / "wheelhouse"
    (tmp_path / "_data").mkdir()
    assert project_wheelhouse(checkout, tmp_path / "_data") is None


def test_outside_the_project_install_points_at_the_wheel_the_project_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = house_with_causal_conv1d(tmp_path / "project" / "wheelhouse", tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(install_module, "project_wheelhouse", lambda: project)
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    asked = InstallRequest(packages=("causal-conv1d",), python=Path("/env/bin/python"), source="wheelhouse")
    with pytest.raises(InstallError) as raised:
        missing_wheelhouse(WheelhouseReader("wheelhouse"), asked, ["causal-conv1d"], ENV, settings,
                           Path("/env/bin/python"))
    error = raised.value
    assert error.message.startswith(f"found no wheelhouse at {elsewhere.resolve() / 'wheelhouse'} (./wheelhouse of "
                                    "the current folder")
    assert "causal_conv1d-1.7.0+cu130torch2.14-py3-none-any.whl, which fits this env" in error.message
    assert error.hint == f"install from it: `builder install causal-conv1d --python /env/bin/python --from {project}`"


def test_outside_the_project_with_nothing_there_either_it_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = house_with_causal_conv1d(tmp_path / "project" / "wheelhouse", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(install_module, "project_wheelhouse", lambda: project)
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    asked = InstallRequest(packages=("fla-core",), python=Path("/env/bin/python"), source="wheelhouse")
    said = missing_wheelhouse(WheelhouseReader("wheelhouse"), asked, ["fla-core"], ENV, settings,
                              Path("/env/bin/python"))
    assert said == (f"found no wheelhouse at {tmp_path.resolve() / 'wheelhouse'} (./wheelhouse of the current folder, "
                    f"where builder install looks unless --from names one); the project's wheelhouse {project} has "
                    "no wheel of fla-core that fits this env either; a wheel built here is published there")
