"""Issue 31 item 5: nothing about the build's torch is accepted silently.

- a torch version the index does not list is refused at plan time, naming the nearest releases it has for the CUDA
  (from the live list, the cache or the shipped snapshot: offline too);
- a torch whose CUDA the index does not say (no PEP 658 file, no range requests, a wheel without METADATA) is
  planned with its CUDA marked unverified, never as known;
- the build venv checks torch.version.cuda after installing torch and stops before compiling on another CUDA line
  or a CPU torch.

Local folder indexes (file://) stand in for PyPI; nothing connects anywhere."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from builder.core.errors import ToolchainError, UsageError
from builder.core.settings import Settings
from builder.discovery.compat import (
    TorchIndex,
    check_torch_listed,
    nearest_releases,
    resolve_index,
    torch_cuda_unverified,
)
from builder.discovery.snapshot import release_notes_listing
from builder.discovery.torchindex import Listing, Release
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.stages.plan import Plan, Target, make_plan
from builder.stages.pyenv import PythonEnv, check_torch_cuda
from tests.helpers import FIXTURES, assert_one_line_error, run_cli

CU130 = 'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"'


def _folder_index(root: Path, wheels: dict[str, list[str] | None]) -> Path:
    """A PEP 503 folder: ``torch/index.html`` linking ``files/*.whl``; each version's wheel holds a METADATA with
    the given Requires-Dist lines, or (None) no METADATA at all: its CUDA cannot be read."""
    (root / "torch").mkdir(parents=True)
    (root / "files").mkdir()
    links = []
    for version, requires in wheels.items():
        name = f"torch-{version}-cp312-cp312-manylinux_2_28_x86_64.whl"
        with zipfile.ZipFile(root / "files" / name, "w") as z:
            z.writestr("torch/__init__.py", "")
            if requires is not None:
                z.writestr(f"torch-{version}.dist-info/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: "
                           f"{version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
        links.append(f'<a href="../files/{name}">{name}</a>')
    (root / "torch" / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root


def _settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache",
                             wheelhouse=tmp_path / "wh", offline=offline)


def _plan(tmp_path: Path, index: Path, torch: str, cuda: str = "13.0", offline: bool = False) -> Plan:
    return make_plan(Target(package="tinyext", version="0.1.0", cuda=CudaVersion.parse(cuda),
                            archs=parse_arch_list("120"), python=PythonSpec("3.12"), torch=torch,
                            torch_index=str(index), toolchain="host"), _settings(tmp_path, offline))


# ---------------------------------------------------------------- a torch the index does not list


def test_nearest_releases_are_the_minor_and_its_neighbours() -> None:
    versions = ("3.0.0", "3.1.0", "3.1.2", "3.3.0", "3.4.0")
    assert nearest_releases(versions, "3.1.1") == ["3.1.0", "3.1.2"]
    assert nearest_releases(versions, "3.2.5") == ["3.1.2", "3.3.0"]
    assert nearest_releases(versions, "9.0.0") == ["3.4.0"]
    assert nearest_releases((), "3.0.0") == []


def test_an_unlisted_torch_is_refused_at_plan_time_naming_the_nearest(tmp_path: Path) -> None:
    index = _folder_index(tmp_path / "idx", {"3.1.0": [CU130], "3.1.2": [CU130], "3.3.0": [CU130],
                                             "3.2.0": ['nvidia-cuda-runtime-cu12==12.8.90']})
    with pytest.raises(UsageError) as refused:
        _plan(tmp_path, index, "3.2.5")
    error = refused.value
    assert error.message.startswith("torch 3.2.5 is not on custom: its release list") and "has no such version" \
        in error.message
    assert error.hint and "its CUDA 13.0 releases nearest to it: 3.1.2, 3.3.0; pass one of those as --torch" in error.hint
    assert "3.2.0" not in error.hint  # a CUDA 12.8 build is no way forward for --cuda 13.0
    assert _plan(tmp_path, index, "3.1.2").torch == "3.1.2"  # a listed one plans


def test_offline_the_shipped_snapshot_refuses_too() -> None:
    """``--torch 2.13.7`` with no cache and no network: the snapshot's list answers, and the cure says how to
    re-read the index in case the release is newer than the snapshot."""
    pypi = resolve_index(None)  # settings=None: the shipped snapshot only
    assert pypi.source == "snapshot"
    with pytest.raises(UsageError) as refused:
        check_torch_listed(pypi, "2.13.7", CudaVersion.parse("13.0"))
    error = refused.value
    assert "torch 2.13.7 is not on pypi" in error.message and "shipped snapshot" in error.message
    assert error.hint and "2.13.0" in error.hint and "2.14.0" in error.hint
    assert "BUILDER_INDEX_REFRESH=1" in error.hint
    check_torch_listed(pypi, "2.13.0", CudaVersion.parse("13.0"))  # listed: no error


def test_a_list_from_release_notes_or_no_list_does_not_refuse_but_is_unverified() -> None:
    """Absence is only proof where the list was read from the index; else the plan says the CUDA is unverified."""
    hearsay = TorchIndex("pytorch-cu128", "https://download.pytorch.org/whl/cu128", release_notes_listing("cu128"))
    check_torch_listed(hearsay, "2.13.7", CudaVersion.parse("12.8"))
    assert "release notes" in (torch_cuda_unverified(hearsay, "2.13.7") or "")
    unread = TorchIndex("custom", "https://mirror.example/simple",
                        Listing("custom", "https://mirror.example/simple", (), "none", "", "not reachable"))
    check_torch_listed(unread, "2.13.7", CudaVersion.parse("13.0"))
    assert "could not be read (not reachable)" in (torch_cuda_unverified(unread, "2.13.7") or "")
    known = TorchIndex("x", "u", Listing("x", "u", (Release("2.11.0", "13.0", (), "METADATA: …", ""),), "index", ""))
    assert torch_cuda_unverified(known, "2.11.0") is None


def test_cli_refuses_an_unlisted_torch_in_one_line(tmp_path: Path, cli_env: dict[str, str]) -> None:
    index = _folder_index(tmp_path / "idx", {"3.1.0": [CU130], "3.3.0": [CU130]})
    bad = run_cli("plan", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--torch-index", str(index),
                  "--cuda", "13.0", "--arch", "120", "--torch", "3.2.5", env=cli_env)
    assert_one_line_error(bad, "torch 3.2.5 is not on custom", "nearest to it: 3.1.0, 3.3.0")
    assert bad.code == UsageError.exit_code


# ---------------------------------------------------------------- a torch whose CUDA cannot be read


def test_an_unreadable_cuda_is_planned_as_unverified_never_as_known(tmp_path: Path) -> None:
    index = _folder_index(tmp_path / "idx", {"3.1.0": [CU130], "3.4.0": None})  # 3.4.0: no METADATA
    plan = _plan(tmp_path, index, "3.4.0")
    assert "does not say which CUDA torch 3.4.0 was built with" in plan.torch_cuda_unverified
    assert "no .dist-info/METADATA member" in plan.torch_cuda_unverified
    rows = dict(plan.describe("yes: host CUDA 13.0.88 at /usr/local/cuda-13.0"))
    assert "its CUDA NOT VERIFIED" in rows["torch"]
    assert rows["label"].startswith("cu13torch3.4  (UNVERIFIED: assumes CUDA 13.0 from --cuda")
    assert rows["buildable here"].endswith("(if torch 3.4.0 proves a CUDA 13.0 build: checked in the build venv)")
    known = _plan(tmp_path, index, "3.1.0")
    assert known.torch_cuda_unverified == "" and "UNVERIFIED" not in dict(known.describe())["label"]


def test_cli_plan_marks_an_unreadable_cuda(tmp_path: Path, cli_env: dict[str, str]) -> None:
    index = _folder_index(tmp_path / "idx", {"3.4.0": None})
    ok = run_cli("plan", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--torch-index", str(index),
                 "--cuda", "13.0", "--arch", "120", "--torch", "3.4.0", env=cli_env)
    assert ok.code == 0, ok.stderr
    assert "UNVERIFIED" in ok.stdout and "NOT VERIFIED" in ok.stdout
    assert "warning: torch 3.4.0: its CUDA is not verified" in ok.stderr


# ---------------------------------------------------------------- the build venv checks torch's CUDA


def _env(torch_cuda: str | None) -> PythonEnv:
    return PythonEnv(Path("/venv/bin/python"), "3.12.1", "3.4.0", torch_cuda, Path("/venv/lib"), True)


def test_the_build_venv_stops_on_another_cuda_or_a_cpu_torch(tmp_path: Path) -> None:
    index = _folder_index(tmp_path / "idx", {"3.4.0": None})
    plan = _plan(tmp_path, index, "3.4.0")
    check_torch_cuda(plan, _env("13.0"))
    check_torch_cuda(plan, _env("13.0.88"))  # the line decides
    with pytest.raises(ToolchainError) as other:
        check_torch_cuda(plan, _env("12.8"))
    assert other.value.message == ("the build venv's torch 3.4.0 from custom is a CUDA 12.8 build, not CUDA 13.0 as "
                                   "planned, which the index did not say: stopped before compiling")
    assert other.value.hint and other.value.hint.startswith("use --cuda 12.8")
    with pytest.raises(ToolchainError) as cpu:
        check_torch_cuda(plan, _env(None))
    assert "is a CPU build (torch.version.cuda is None), not CUDA 13.0" in cpu.value.message
    assert cpu.value.hint and "e.g. --torch-index cu130" in cpu.value.hint


def test_python_for_checks_a_made_venv_and_a_brought_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways a build gets its torch (a venv made here; a host's own Python, as the docker toolchain brings)
    are checked before anything compiles."""
    import builder.stages.pyenv as pyenv
    from builder.toolchain.base import PreparedPython

    index = _folder_index(tmp_path / "idx", {"3.4.0": None})
    plan = _plan(tmp_path, index, "3.4.0")
    monkeypatch.setattr(pyenv, "find_interpreter", lambda *a, **k: Path("/usr/bin/python3.12"))
    monkeypatch.setattr(pyenv, "managed_env", lambda *a, **k: _env(None))
    with pytest.raises(ToolchainError, match="is a CPU build"):
        pyenv.python_for(plan, _settings(tmp_path))
    monkeypatch.setattr(pyenv, "managed_env", lambda *a, **k: _env("13.0"))
    assert pyenv.python_for(plan, _settings(tmp_path))[0].torch_cuda == "13.0"

    class Brings:
        where = " in image"

        def prepare_python(self, *args: object) -> PreparedPython:
            return PreparedPython(Path("/opt/python/bin/python"), "3.12", "3.4.0+cu128", "12.8", Path("/opt/lib"),
                                  None)  # type: ignore[arg-type]

    with pytest.raises(ToolchainError, match="is a CUDA 12.8 build, not CUDA 13.0"):
        pyenv.python_for(plan, _settings(tmp_path), Brings())  # type: ignore[arg-type]
