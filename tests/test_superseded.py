"""Superseded builds (docs/INDEX.md): a fix patch's ``build = N`` becomes the wheel's PEP 427 build tag, the index
marks the older build of the same file yanked where it lists the newer, and doctor, install and verify find an
installed (or published) older build. The installs are real: uv and pip from a file:// wheelhouse into venvs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.core.errors import RecipeError
from builder.core.uvtool import uv_bin
from builder.core.wheelfile import build_number, set_wheel_build, superseded, with_build, without_build
from builder.index.layout import Layout
from builder.index.store import Wheelhouse
from builder.model.recipe import load_recipe
from builder.model.records import BuildRecord, WheelBuild
from builder.pipeline.verify import superseded_lines
from builder.stages.finalize import finalize_wheel, read_build_record
from builder.user.envprobe import PackageSpec, probe_env
from builder.user.fit import EnvFacts, Verdict, best
from builder.user.installer import install_argv
from builder.user.superseded import installed_superseded
from builder.user.wheelhouse import WheelhouseReader
from tests.test_index import raw_wheel
from tests.test_index_clients import _clean_env

LABEL = "cu130torch2.14"
FIX = WheelBuild(1, ("0005-fix.patch: kernel fix: the tail",))
OLD = f"alpha-1.0+{LABEL}-py3-none-any.whl"
NEW = f"alpha-1.0+{LABEL}-1-py3-none-any.whl"


def test_build_tag_name_parts() -> None:
    assert build_number(OLD) == 0 and build_number(NEW) == 1
    assert without_build(NEW) == OLD and without_build(OLD) == OLD
    assert with_build(OLD, 1) == NEW and with_build(NEW, 0) == OLD and with_build(NEW, 2) == NEW.replace("-1-", "-2-")
    variant = "x-1.0+cu13-cp310-abi3-linux_x86_64-sm120.whl"  # PEP 825: the label stays last
    assert with_build(variant, 1) == "x-1.0+cu13-1-cp310-abi3-linux_x86_64-sm120.whl"
    assert without_build(with_build(variant, 1)) == variant and build_number(with_build(variant, 1)) == 1
    names = [OLD, NEW, NEW.replace("-1-", "-2-"), "alpha-2.0-py3-none-any.whl", variant]
    assert superseded(names) == {OLD: names[2], NEW: names[2]}
    assert set_wheel_build("Wheel-Version: 1.0\nBuild: 1\nTag: py3-none-any\n", 2).splitlines()[-1] == "Build: 2"
    assert "Build" not in set_wheel_build("Wheel-Version: 1.0\nBuild: 1\n", 0)


def _recipe(tmp_path: Path, patch_lines: str) -> Path:
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "0005-fix.patch").write_text("")
    recipe = tmp_path / "recipes" / "demo" / "recipe.toml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text('name = "demo"\nversions = ">=1.0"\n\n[source]\npypi = "demo"\n\n[[patch]]\n'
                      'file = "0005-fix.patch"\nversions = ">=1.0,<2"\nsummary = "kernel fix: the tail"\n' + patch_lines)
    return recipe


def test_recipe_build_key(tmp_path: Path) -> None:
    from packaging.version import Version
    recipe = load_recipe(_recipe(tmp_path, "build = 1\n"), tmp_path / "patches")
    assert recipe.build_of(Version("1.5+cu13"), "torch-stable") == (1, "0005: kernel fix: the tail")
    assert recipe.build_of(Version("2.0"), None) == (0, "")  # outside the patch's versions: no build tag


@pytest.mark.parametrize(("lines", "said"), [("build = 0\n", "build"), ("build = true\n", "integer"),
                                             ("build = 1\ntest-only = true\n", "test-only")])
def test_recipe_build_key_refused(tmp_path: Path, lines: str, said: str) -> None:
    with pytest.raises(RecipeError, match=said):
        load_recipe(_recipe(tmp_path, lines), tmp_path / "patches")


def _builds(tmp: Path) -> tuple[Path, Path]:
    """The same version and label built twice: before the fix (no build tag) and with it (build 1)."""
    raw = raw_wheel(tmp / "raw", "alpha", "1.0")
    old = finalize_wheel(raw, tmp / "old", label=LABEL, pins=[], build_record=BuildRecord(package="alpha"))
    new = finalize_wheel(raw, tmp / "new", label=LABEL, pins=[], build_record=BuildRecord(package="alpha", build=FIX))
    return old, new


def test_finalize_writes_the_build_tag(tmp_path: Path) -> None:
    old, new = _builds(tmp_path)
    assert (old.name, new.name) == (OLD, NEW)
    with zipfile.ZipFile(new) as zf:
        wheel_file = zf.read(f"alpha-1.0+{LABEL}.dist-info/WHEEL").decode()
    assert "Build: 1" in wheel_file.splitlines()
    record = read_build_record(new)
    assert record is not None and record.build == FIX and record.build_number == 1
    assert BuildRecord.from_json(json.loads(record.file_bytes())).build == FIX  # the record keeps it
    assert read_build_record(old) is not None and "build" not in json.loads(BuildRecord(package="alpha").file_bytes())


@pytest.fixture()
def house(tmp_path: Path) -> Wheelhouse:
    old, new = _builds(tmp_path / "built")
    house = Wheelhouse(tmp_path / "wh")
    house.publish(old, BuildRecord(package="alpha"))
    house.publish(new, BuildRecord(package="alpha", build=FIX))
    return house


def test_pages_yank_the_superseded_build(house: Wheelhouse) -> None:
    paths = Layout(house.root)
    # no torch requirement: a resolver would pair them with any torch, so the combined index leaves them out
    # (index/channelpolicy.py root_lists) and the channel is the page that lists both builds
    assert not paths.project_page("alpha", None, json=True).exists()
    for label in (LABEL,):
        page = paths.project_page("alpha", label, json=True)
        files = {f["filename"]: f for f in json.loads(page.read_text())["files"]}
        assert files[NEW]["yanked"] is False
        assert files[OLD]["yanked"] == f"superseded by build 1 ({NEW}; 0005: kernel fix: the tail)"
        html_page = (page.parent / "index.html").read_text()
        lines = {line.split(">")[-3].split("<")[0]: line for line in html_page.splitlines() if "<a href" in line}
        assert 'data-yanked="superseded by build 1 (' in lines[OLD] and "data-yanked" not in lines[NEW]


def _venv(tmp: Path, name: str) -> Path:
    subprocess.run([uv_bin(), "venv", "-q", "--no-config", "--python", sys.executable, str(tmp / name)], check=True,
                   env=_clean_env(tmp))
    return tmp / name / "bin" / "python"


def _installed_build(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.distribution('alpha').read_text('WHEEL'))"
    text = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return next((line for line in text.splitlines() if line.startswith("Build:")), "no build tag")


def _run(argv: list[str], tmp: Path) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=_clean_env(tmp), timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_clients_take_the_new_build_and_replace_the_old(house: Wheelhouse, tmp_path: Path, tool: str) -> None:
    """A fresh install takes build 1; an env that has the old file keeps it through a plain install (measured:
    uv "Checked 1 package", pip "Requirement already satisfied"), and the reinstall doctor and install give it
    replaces it; doctor's check names the superseded build."""
    channel = (house.root / "channels" / LABEL / "simple").as_uri() + "/"

    def install(python: Path) -> list[str]:
        if tool == "uv":
            return [uv_bin(), "pip", "install", "--no-config", "--python", str(python), "--index-url", channel]
        return [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-cache-dir", "--index-url",
                channel]

    python = _venv(tmp_path, "fresh")
    _run([*install(python), "alpha==1.0"], tmp_path)
    assert _installed_build(python) == "Build: 1"

    env = _venv(tmp_path, "old")  # the broken build, installed before the fix was published
    _run([uv_bin(), "pip", "install", "--no-config", "--python", str(env), str(house.wheels / OLD)], tmp_path)
    _run([*install(env), "alpha==1.0"], tmp_path)
    assert _installed_build(env) == "no build tag"  # the same version is installed: nothing changes

    reader = WheelhouseReader(house.root)
    report = probe_env(env, [PackageSpec("alpha")]).package("alpha")
    old = installed_superseded(report, None, reader.wheels("alpha"))
    assert old is not None and (old.build, old.newest, old.wheel) == (0, 1, NEW)
    assert old.line(env) == (f"alpha 1.0+{LABEL} build 0 is superseded by build 1 (a fix of the recipe): reinstall "
                             f"with builder install alpha --python {env}")

    # the wheel install chooses among the fitting files of one version is the newest build, whatever its name
    # sorts as ("alpha-1.0+…-1-py3…" sorts before "alpha-1.0+…-py3…"): the old file chosen was the first demo's bug
    fitting = [Verdict(w, ()) for w in reader.wheels("alpha")]
    assert {v.wheel.filename for v in fitting} == {OLD, NEW}
    picked = best(fitting) or best(list(reversed(fitting)))
    assert picked is not None and picked.wheel.filename == NEW == best(list(reversed(fitting))).wheel.filename
    chosen = [picked.wheel]
    facts = EnvFacts(python="3.11", tags=frozenset(), torch=None, torch_cuda=None)
    argv = install_argv(env, chosen, facts, tool="uv-internal" if tool == "uv" else "pip", reinstall=("alpha",))
    assert ("--reinstall-package" if tool == "uv" else "--force-reinstall") in argv
    if tool == "pip":
        argv = [sys.executable, "-m", "pip", "--python", str(env), "install", *argv[4:]]
    _run(argv, tmp_path)
    assert _installed_build(env) == "Build: 1"
    report = probe_env(env, [PackageSpec("alpha")]).package("alpha")
    assert installed_superseded(report, None, reader.wheels("alpha")) is None


def test_verify_names_superseded_wheels(house: Wheelhouse, tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, "build = 2\n"), tmp_path / "patches")
    recipe = type(recipe)(**{**recipe.__dict__, "name": "alpha"})
    second, first = superseded_lines(house, recipe)  # in file-name order: the build-1 file sorts first
    assert first.startswith(f"{OLD}: build 0 is superseded by {NEW} (its pages mark it yanked)")
    assert second.startswith(f"alpha 1.0+{LABEL} build 1 ({NEW}) is superseded by build 2 (0005: kernel fix: "
                               "the tail): rebuild it (builder build alpha --version 1.0")
