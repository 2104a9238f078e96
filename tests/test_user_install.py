"""The user's side, run as a user would: the README's install commands copied out of README.md and run with bash,
real uv and real pip, into real venvs, against a real wheelhouse; torch must not move.

Stand-ins, because the real things cost gigabytes per test: ``torch`` is a tiny wheel that reports the version and
CUDA of PyPI's torch 2.10.0 (CUDA 12.8), 2.14.1 and 2.15.0 (CUDA 13.x), served by a local index that takes PyPI's place
(UV_INDEX_URL / PIP_INDEX_URL), so a resolver that wanted to swap torch could; the kernel packages are small
labelled wheels that pin torch like real builds. The negative control shows the swap happening through the
combined index, so these tests can fail. The same commands with real torch are in the closing notes / docs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from builder.core.wheelfile import write_wheel
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.helpers import ROOT
from tests.test_index import labelled_wheel

TORCHES = {"2.10.0": "12.8", "2.14.1": "13.0", "2.15.0": "13.2"}
README = (ROOT / "README.md").read_text()


def stand_in_torch(folder: Path, version: str, cuda: str) -> Path:
    """A wheel named torch that answers what the doctor/install probes ask (version, CUDA, no GPU)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    code = (f"__version__ = {version + '+cu' + cuda.replace('.', '')!r}\n"
            f"class version:\n    cuda = {cuda!r}\n"
            "class cuda:\n    is_available = staticmethod(lambda: False)\n"
            "    get_arch_list = staticmethod(lambda: [])\n    device_count = staticmethod(lambda: 0)\n")
    entries = {
        "torch/__init__.py": code.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\nstand-in\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    write_wheel(wheel, entries, info, {})
    return wheel


@dataclass
class World:
    project: Path  # cwd for the README's commands: .venv (the builder's) and wheelhouse/ are here
    pypi: str  # the stand-in PyPI
    env: dict[str, str]
    tmp: Path


def user_world(tmp: Path, torches: dict[str, str], columns: str = "200") -> World:
    """A stand-in PyPI holding a stand-in torch of each version (its CUDA as value), the project folder with the
    builder's own venv (as after the README's install) and an environment that reaches only that PyPI."""
    pypi = Wheelhouse(tmp / "pypi")
    for version, cuda in torches.items():
        pypi.publish(stand_in_torch(tmp / "torches", version, cuda), BuildRecord.from_json({}))
    project = tmp / "project"
    project.mkdir()
    (project / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "CONDA"))}
    env.update(UV_INDEX_URL=pypi.index_url(), PIP_INDEX_URL=pypi.index_url(), PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1", UV_CACHE_DIR=str(tmp / "uv-cache"),
               UV_NO_PROGRESS="1", DOCKER_HOST="unix:///nonexistent.sock", COLUMNS=columns,
               BUILDER_CACHE_DIR=str(tmp / "cache"))
    return World(project, pypi.index_url(), env, tmp)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("user")
    world = user_world(tmp, TORCHES)
    house = Wheelhouse(world.project / "wheelhouse")
    for label, pin in (("cu128torch2.10", "torch==2.10.0"), ("cu130torch2.14", "torch==2.14.1")):
        house.publish(labelled_wheel(tmp, "fla-core", "0.6.0", label, pins=(pin,)), BuildRecord.from_json({}))
    house.publish(labelled_wheel(tmp, "causal-conv1d", "1.7.0", "cu130torch2.14", pins=("torch==2.14.1",)),
                  BuildRecord.from_json({"inspect": {"objects": [{"path": "c.so", "sass": ["sm_120"], "ptx": [], "needed": []}]}}))
    return world


def make_venv(world: World, name: str, torch: str) -> Path:
    """A venv with pip (python -m venv) holding the stand-in torch ``torch``."""
    venv = world.tmp / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=world.env)
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"torch=={torch}"],
                   check=True, env=world.env)
    return venv


def installed(venv: Path, name: str) -> str | None:
    code = f"import importlib.metadata as m\ntry: print(m.version({name!r}))\nexcept Exception: print('')"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() or None


def readme_block(after: str) -> str:
    """The first ```bash block after the text ``after`` in README.md."""
    start = README.index(after)
    match = re.search(r"```bash\n(.*?)```", README[start:], re.DOTALL)
    assert match, f"no bash block after {after!r} in README.md"
    return match.group(1)


def run_block(world: World, block: str, venv: Path) -> subprocess.CompletedProcess:
    """Run a README block with bash in the project folder, its ``V=`` line pointing at ``venv``."""
    lines = block.splitlines()
    assert lines[0].startswith("V="), lines[0]
    script = "\n".join([f"V={venv}", *lines[1:]])
    return subprocess.run(["bash", "-c", script], cwd=world.project, env=world.env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.parametrize("torch", ["2.10.0", "2.14.1"])
def test_readme_doctor_and_install_keep_torch(world: World, torch: str) -> None:
    venv = make_venv(world, f"readme-{torch}", torch)
    result = run_block(world, readme_block("**Into the env you already have**"), venv)
    out = result.stdout + result.stderr
    assert installed(venv, "torch") == torch, out
    if torch == "2.10.0":
        assert installed(venv, "fla-core") == "0.6.0+cu128torch2.10", out
        assert installed(venv, "causal-conv1d") is None
        assert result.returncode == 12, out  # causal-conv1d refused: no CUDA 12.8 compiler on this machine
        error = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and "no causal-conv1d wheel fits" in error[0] and "cannot build one" in error[0], out
        assert "or use torch 2.14.1 (a CUDA 13.0 build" in out and "torch==2.14.1" in out, out
        assert "channels/cu128torch2.10/simple/" in out, out  # where a farm-built cu128 wheel would appear
    else:
        assert result.returncode == 0, out
        assert installed(venv, "fla-core") == "0.6.0+cu130torch2.14"
        assert installed(venv, "causal-conv1d") == "1.7.0+cu130torch2.14"
    assert f"torch {torch}" in out  # doctor's report and install's summary name the torch they found


@pytest.mark.parametrize("torch", ["2.10.0", "2.14.1"])
def test_readme_by_hand_uv_and_pip_keep_torch(world: World, torch: str) -> None:
    venv = make_venv(world, f"hand-{torch}", torch)
    result = run_block(world, readme_block("By hand, for any env"), venv)
    assert installed(venv, "torch") == torch
    if torch == "2.10.0":  # its channel has fla-core only: the installers find no causal-conv1d and say so
        assert result.returncode != 0 and installed(venv, "causal-conv1d") is None, result.stdout + result.stderr
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert installed(venv, "causal-conv1d") == "1.7.0+cu130torch2.14"


def test_the_combined_index_does_swap_torch(world: World) -> None:
    """The negative control: the command the README used to give replaces torch 2.10.0 (the reason for channels)."""
    venv = make_venv(world, "combined", "2.10.0")
    simple = (world.project / "wheelhouse" / "simple").as_uri()
    subprocess.run([uv_bin(), "pip", "install", "--python", str(venv / "bin" / "python"), "--extra-index-url", simple,
                    "fla-core==0.6.0"], check=True, env=world.env, capture_output=True)
    assert installed(venv, "fla-core") == "0.6.0+cu130torch2.14"
    assert installed(venv, "torch") == "2.14.1"


def test_doctor_json_names_what_fits_and_the_commands(world: World) -> None:
    venv = make_venv(world, "doctor", "2.10.0")
    result = subprocess.run([str(world.project / ".venv" / "bin" / "builder"), "doctor", "--python",
                             str(venv / "bin" / "python"), "--json"], cwd=world.project, env=world.env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["env"]["torch"]["cuda"] == "12.8" and report["facts"]["torch"] == "2.10.0"
    offers = {o["package"]: o for o in report["offers"]}
    assert offers["fla-core"]["chosen"]["wheel"]["filename"].startswith("fla_core-0.6.0+cu128torch2.10")
    assert offers["causal-conv1d"]["chosen"] is None
    assert any("pins torch==2.14.1" in r for v in offers["causal-conv1d"]["verdicts"] for r in v["reasons"])
    assert report["commands"][0] == f"builder install fla-core --python {venv / 'bin' / 'python'}"
    assert "channels/cu128torch2.10/simple/" in report["commands"][1] and "torch==2.10.0" in report["commands"][1]
    assert any("no CUDA 12.8 compiler here" in a for a in report["advice"]), report["advice"]


def test_doctor_and_install_take_a_venv_folder(world: World) -> None:
    """``--python VENV`` (the folder, as --help offers) where a wheel fits: doctor ran the folder as a program
    (PermissionError, a traceback) before issue 31; the folder now stands for its bin/python everywhere."""
    venv = make_venv(world, "folder", "2.14.1")
    doctor = _builder(world, "doctor", "--python", str(venv), "--json")
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr, doctor.stderr
    report = json.loads(doctor.stdout)
    python = str(venv / "bin" / "python")
    assert report["commands"][0] == f"builder install causal-conv1d fla-core --python {python}", report["commands"]
    assert report["commands"][2].startswith(f"{python} -m pip install"), report["commands"]  # the env has pip
    install = _builder(world, "install", "fla-core", "--python", str(venv))
    assert install.returncode == 0, install.stderr
    assert installed(venv, "fla-core") == "0.6.0+cu130torch2.14" and installed(venv, "torch") == "2.14.1"
    missing = _builder(world, "doctor", "--python", str(world.tmp / "no-such-venv"))
    assert missing.returncode == 2 and "no such interpreter" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("offline", [False, True])
def test_install_dry_run_prints_the_command_the_install_runs(world: World, offline: bool) -> None:
    """Issue 42: --dry-run printed `uv pip install … torch==X` while the install ran this tool's uv with a temporary
    constraints file. The line after "would run:" must be, word for word, the `+ ` line the real install echoes."""
    venv = make_venv(world, f"dry-run-{offline}", "2.14.1")
    flags = ["--offline"] if offline else []
    dry = _builder(world, "install", "fla-core", "causal-conv1d", "--python", str(venv), "--dry-run", *flags)
    assert dry.returncode == 0, dry.stderr
    (planned,) = [line.removeprefix("would run: ") for line in dry.stdout.splitlines() if line.startswith("would run:")]
    assert installed(venv, "fla-core") is None  # a dry run installs nothing
    real = _builder(world, "install", "fla-core", "causal-conv1d", "--python", str(venv), *flags)
    assert real.returncode == 0, real.stderr
    ran = [line.removeprefix("+ ") for line in real.stderr.splitlines() if line.startswith("+ ") and " pip install " in line]
    assert ran == [planned], (planned, real.stderr)
    assert ("--offline" in planned.split()) is offline and "torch==2.14.1" in planned.split()
    assert installed(venv, "fla-core") == "0.6.0+cu130torch2.14" and installed(venv, "torch") == "2.14.1"


def test_install_without_torch_refuses(world: World) -> None:
    venv = world.tmp / "no-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    result = subprocess.run([str(world.project / ".venv" / "bin" / "builder"), "install", "fla-core", "--python",
                             str(venv / "bin" / "python")], cwd=world.project, env=world.env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 12, result.stderr
    assert "has no torch" in result.stderr and "never chooses torch for you" in result.stderr


def _builder(world: World, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(world.project / ".venv" / "bin" / "builder"), *args], cwd=world.project, env=world.env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cuda_comes_from_the_envs_torch_and_is_checked_against_it(world: World) -> None:
    old, new = make_venv(world, "target-128", "2.10.0"), make_venv(world, "target-130", "2.14.1")
    recipes = str(ROOT / "tests" / "fixtures" / "recipes")
    for venv, cuda in ((old, "12.8"), (new, "13.0")):
        result = _builder(world, "plan", "tinyext", "--recipes", recipes, "--python", str(venv / "bin" / "python"),
                          "--arch", "120")
        assert result.returncode == 0, result.stderr
        assert re.search(rf"cuda\s+{re.escape(cuda)}\b", result.stdout), result.stdout
        assert f"--cuda {cuda}: the CUDA of torch" in result.stderr
    mismatch = _builder(world, "plan", "tinyext", "--recipes", recipes, "--python", str(old / "bin" / "python"),
                        "--cuda", "13.0", "--arch", "120")
    assert mismatch.returncode == 2 and "is a CUDA 12.8 build" in mismatch.stderr, mismatch.stderr
    no_gpu = _builder(world, "plan", "tinyext", "--recipes", recipes, "--python", str(new / "bin" / "python"),
                      "--arch", "native")
    assert no_gpu.returncode == 2 and "--arch native: no GPU visible here" in no_gpu.stderr, no_gpu.stderr
    no_cuda = _builder(world, "plan", "tinyext", "--recipes", recipes, "--arch", "120")
    assert no_cuda.returncode == 2 and "--cuda is required: it names the CUDA of the compiler" in no_cuda.stderr
