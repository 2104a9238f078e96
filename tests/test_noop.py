"""What a no-op build remembers instead of asking again (issue 19 item 2): each cache is reused while its files
stay as they are and asked again when they change.

Real programs throughout (a real venv made by uv, real shell scripts, the real nvcc and c++ where present). Two
stand-ins, because the real things cannot change on request here: an nvcc/compiler that is a shell script (so a test
can upgrade it), and a tiny ``torch`` package in a real venv (the real torch takes seconds to import and cannot be
reinstalled in a test); each stand-in writes a line to a log when it runs, which is what the tests count.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.errors import ToolchainError
from builder.core.filememo import remembered
from builder.core.uvtool import uv_bin
from builder.stages.pyenv import remember_env, reuse_env
from builder.toolchain.base import nvcc_version
from builder.toolchain.host import candidate_homes
from builder.toolchain.hostcompiler import host_compiler
from builder.toolchain.local import find_interpreter, interpreter_facts, pyenv_shim_root


def _script(path: Path, log: Path, output: str) -> Path:
    """A shell script that appends a line to ``log`` each time it runs and prints ``output``."""
    path.write_text(f"#!/bin/sh\necho ran >> {log}\necho '{output}'\n")
    path.chmod(0o755)
    return path


def _program(path: Path, log: Path, output: str) -> Path:
    """A compiled program that does what ``_script`` does (a script's answer is never kept on disk)."""
    source = path.with_suffix(".c")
    source.write_text('#include <stdio.h>\nint main(void) { FILE *f = fopen(LOG, "a"); fputs("ran\\n", f); '
                      'fclose(f); puts(OUT); return 0; }\n')
    tmp = path.with_name(path.name + ".new")
    subprocess.run(["cc", f"-DLOG={json.dumps(str(log))}", f"-DOUT={json.dumps(output)}", "-o", str(tmp),
                    str(source)], check=True)
    tmp.replace(path)  # a new file, as an upgrade installs one
    return path


needs_cc = pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler (cc) to make the stand-in programs")


def _runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _bump(path: Path) -> None:
    """A later mtime, as an upgrade in place gives (the filesystem's clock may be coarse)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_remembered_asks_once_per_file_identity(tmp_path: Path) -> None:
    target = tmp_path / "tool"
    target.write_text("v1")
    asked: list[int] = []

    def ask() -> str:
        asked.append(1)
        return target.read_text()

    memo = tmp_path / "memo"
    assert remembered(memo, "t", [target], ["q"], ask) == "v1"
    assert remembered(memo, "t", [target], ["q"], ask) == "v1"
    assert len(asked) == 1
    assert remembered(memo, "t", [target], ["other question"], ask) == "v1" and len(asked) == 2
    target.write_text("v2")  # another size and mtime
    assert remembered(memo, "t", [target], ["q"], ask) == "v2" and len(asked) == 3
    assert remembered(None, "t", [target], ["q"], ask) == "v2" and len(asked) == 4  # no memo: always asked


@needs_cc
def test_nvcc_version_is_remembered_until_nvcc_changes(tmp_path: Path) -> None:
    log, memo = tmp_path / "nvcc.log", tmp_path / "memo"
    nvcc = _program(tmp_path / "nvcc", log, "Cuda compilation tools, release 13.0, V13.0.88")
    assert str(nvcc_version(nvcc, memo)) == "13.0.88"
    assert str(nvcc_version(nvcc, memo)) == "13.0.88"
    assert _runs(log) == 1 and len(list(memo.glob("nvcc-*.json"))) == 1
    _program(nvcc, log, "Cuda compilation tools, release 13.1, V13.1.80")  # upgraded
    assert str(nvcc_version(nvcc, memo)) == "13.1.80" and _runs(log) == 2
    assert str(nvcc_version(nvcc)) == "13.1.80" and _runs(log) == 3  # without a memo: asked


def test_a_scripts_answer_is_kept_for_one_process_only(tmp_path: Path) -> None:
    """/usr/local/bin/nvcc here is `exec /usr/local/cuda-13.0/bin/nvcc`: the script stays when CUDA changes."""
    log, memo = tmp_path / "nvcc.log", tmp_path / "memo"
    nvcc = _script(tmp_path / "nvcc", log, "Cuda compilation tools, release 13.0, V13.0.88")
    assert nvcc_version(nvcc, memo) == nvcc_version(nvcc, memo) and _runs(log) == 1
    assert not list(memo.glob("*.json"))
    code = ("from pathlib import Path\nfrom builder.toolchain.base import nvcc_version\n"
            f"print(nvcc_version(Path({str(nvcc)!r}), Path({str(memo)!r})))")
    for _ in range(2):  # each new process asks
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
    assert _runs(log) == 3


@pytest.mark.skipif(not candidate_homes(os.environ), reason="no CUDA toolkit on this machine")
def test_real_nvcc_remembered_answer_is_the_same(tmp_path: Path) -> None:
    nvcc = candidate_homes(os.environ)[0] / "bin" / "nvcc"  # the toolkit's own binary, as the host toolchain asks
    assert nvcc_version(nvcc, tmp_path) == nvcc_version(nvcc, tmp_path) == nvcc_version(nvcc)
    assert len(list(tmp_path.glob("nvcc-*.json"))) == 1


@needs_cc
def test_host_compiler_is_remembered_until_the_compiler_or_its_launcher_changes(tmp_path: Path) -> None:
    log, memo = tmp_path / "cc.log", tmp_path / "memo"
    cxx = _program(tmp_path / "fakecxx", log, "fakecxx 1.0")
    launcher = _program(tmp_path / "launch", log, "launched fakecxx 1.0")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CXX": "fakecxx"}
    first = host_compiler(env, memo)
    assert first == host_compiler(env, memo) == {"cxx": f"{cxx}: fakecxx 1.0"} and _runs(log) == 1
    _program(cxx, log, "fakecxx 2.0")
    assert host_compiler(env, memo) == {"cxx": f"{cxx}: fakecxx 2.0"} and _runs(log) == 2
    launched = {**env, "CXX": "launch fakecxx"}  # like "ccache c++": the compiler answers through the launcher
    assert host_compiler(launched, memo)["cxx"] == f"{launcher} fakecxx: launched fakecxx 1.0" and _runs(log) == 3
    assert host_compiler(launched, memo) and _runs(log) == 3
    _program(cxx, log, "fakecxx 3.0")  # the compiler behind the launcher changed: asked again
    host_compiler(launched, memo)
    assert _runs(log) == 4
    assert host_compiler(launched) and _runs(log) == 5  # without a memo: asked


@pytest.mark.skipif(not shutil.which("c++"), reason="no c++ on PATH")
def test_real_compiler_remembered_answer_is_the_same(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"]}
    assert host_compiler(env, tmp_path) == host_compiler(env, tmp_path) == host_compiler(env)


def test_interpreter_facts_without_torch_are_remembered_until_the_interpreter_changes(tmp_path: Path) -> None:
    log, memo = tmp_path / "py.log", tmp_path / "memo"
    fake = tmp_path / "python3.99"
    fake.write_text(f'#!/bin/sh\necho ran >> {log}\nexec python3 "$@"\n')
    fake.chmod(0o755)
    facts = interpreter_facts(fake, with_torch=False, memo=memo)
    assert interpreter_facts(fake, with_torch=False, memo=memo) == facts and _runs(log) == 1
    _bump(fake)
    assert interpreter_facts(fake, with_torch=False, memo=memo) == facts and _runs(log) == 2
    interpreter_facts(fake, with_torch=True, memo=memo)  # torch lives elsewhere: never remembered
    assert _runs(log) == 3


# ---------------------------------------------------------------- the build venv's identity, in its marker


@pytest.fixture
def venv(tmp_path: Path) -> dict[str, Path]:
    """A real venv (uv) holding a stand-in torch 9.9.1 whose import is logged."""
    root = tmp_path / "build-venv"
    subprocess.run([uv_bin(), "venv", "--quiet", "--python", "3", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    log = tmp_path / "torch-imports.log"
    _stand_in_torch(purelib, log, "9.9.1")
    return {"root": root, "python": python, "purelib": purelib, "log": log, "marker": root / ".builder-env.json"}


def _stand_in_torch(purelib: Path, log: Path, version: str) -> None:
    (purelib / "torch").mkdir(exist_ok=True)
    (purelib / "torch" / "__init__.py").write_text(
        f"open({str(log)!r}, 'a').write('imported\\n')\nfrom torch import version\n__version__ = version.__version__\n")
    (purelib / "torch" / "version.py").write_text(f"__version__ = {version!r}\ncuda = '13.0'\n")
    for old in purelib.glob("torch-*.dist-info"):
        shutil.rmtree(old)
    (purelib / f"torch-{version}.dist-info").mkdir()
    (purelib / f"torch-{version}.dist-info" / "METADATA").write_text(f"Name: torch\nVersion: {version}\n")


def test_a_reused_venv_is_not_probed_while_torch_stays(venv: dict[str, Path]) -> None:
    marker, python, log = venv["marker"], venv["python"], venv["log"]
    # a marker from before this change (the plain record): probed once, then the identity is written into it
    marker.write_text(json.dumps({"python": str(python), "version": "3.x", "torch": "old", "torch_cuda": None}))
    first = reuse_env(marker, python)
    assert (first.torch, first.torch_cuda, first.purelib) == ("9.9.1", "13.0", venv["purelib"]) and _runs(log) == 1
    assert set(json.loads(marker.read_text())) >= {"purelib", "executable", "stamp", "torch", "version"}
    before = marker.stat().st_mtime_ns
    time.sleep(0.01)
    again = reuse_env(marker, python)
    assert again == first and _runs(log) == 1  # no interpreter started
    assert marker.stat().st_mtime_ns > before  # the last use is still marked (cache clean --older-than)


def test_a_reinstalled_torch_is_probed_again(venv: dict[str, Path]) -> None:
    marker, python, log = venv["marker"], venv["python"], venv["log"]
    marker.write_text("{}")
    assert reuse_env(marker, python).torch == "9.9.1" and _runs(log) == 1
    _stand_in_torch(venv["purelib"], log, "9.9.2")  # `uv pip install torch==…` into the venv by hand
    assert reuse_env(marker, python).torch == "9.9.2" and _runs(log) == 2
    assert reuse_env(marker, python).torch == "9.9.2" and _runs(log) == 2
    # torch's files changed in place (same dist-info): its version.py is in the stamp
    (venv["purelib"] / "torch" / "version.py").write_text("__version__ = '9.9.2'\ncuda = '13.1'\n")
    _bump(venv["purelib"] / "torch" / "version.py")
    assert reuse_env(marker, python).torch_cuda == "13.1" and _runs(log) == 3


def test_a_marker_without_the_identity_or_naming_another_python_is_probed(venv: dict[str, Path]) -> None:
    marker, python, log = venv["marker"], venv["python"], venv["log"]
    marker.write_text("{}")
    env = reuse_env(marker, python)
    assert _runs(log) == 1
    data = json.loads(marker.read_text())
    marker.write_text(json.dumps({**data, "python": "/elsewhere/bin/python"}))
    reuse_env(marker, python)
    assert _runs(log) == 2
    remember_env(marker, env)
    (venv["purelib"] / "torch" / "version.py").unlink()  # nothing to key on: probed (and here, failing)
    with pytest.raises(ToolchainError, match="torch is not importable"):
        reuse_env(marker, python)


# ---------------------------------------------------------------- offline: no side effects


def test_offline_never_installs_build_requirements_into_a_given_python(venv: dict[str, Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``--python PATH`` lacking ``build``: an offline resolution (the farm's up-front check is one) installs
    nothing into it and fails with one error naming what is missing and the cure (the check leaves it to the
    worker). Before, it ran ``uv pip install`` into that interpreter."""
    import builder.core.uvtool
    import builder.stages.pyenv
    from builder.core.settings import Settings
    from builder.model.arch import parse_arch_list
    from builder.model.cuda import CudaVersion
    from builder.model.python import PythonSpec
    from builder.stages.plan import Target, make_plan
    from builder.stages.pyenv import python_for
    from tests.helpers import FIXTURES

    def no_install(args: list[str], **kwargs: object) -> None:
        raise AssertionError(f"uv ran: {args}")

    monkeypatch.setattr(builder.stages.pyenv, "run_uv", no_install)
    monkeypatch.setattr(builder.core.uvtool, "run_uv", no_install)
    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache", offline=True)
    plan = make_plan(Target(package="tinyext", version="0.1.0", cuda=CudaVersion.parse("13.0"),
                            archs=parse_arch_list("120"), python=PythonSpec(str(venv["python"])),
                            toolchain="host"), settings)
    with pytest.raises(ToolchainError) as failed:
        python_for(plan, settings)
    error = failed.value
    assert "the build requirements build, setuptools>=64, wheel" in error.message
    assert "--offline forbids installing them" in error.message
    assert error.hint and f"uv pip install --python {venv['python']} build" in error.hint
    has_build = subprocess.run([str(venv["python"]), "-c", "import build"], capture_output=True, check=False,
                               cwd=tmp_path)  # not the checkout: a stray build/ folder there imports as `build`
    assert has_build.returncode != 0  # still not there


# ---------------------------------------------------------------- a pyenv shim, resolved once (issue 31 item 11)

PY = f"{sys.version_info.major}.{sys.version_info.minor}"  # a version this machine has: the tests' own


@pytest.fixture
def pyenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A pyenv root laid out as pyenv lays it out, whose ``pyenv`` (a small sh stand-in for pyenv's hundreds of
    bash processes) logs each run and picks the version the way pyenv-version-file does; its one installed version
    ``PY.0`` is a link to the real interpreter running these tests. The shim is pyenv's own shim text."""
    root, log = tmp_path / "pyenv", tmp_path / "pyenv.log"
    (root / "libexec").mkdir(parents=True)
    (root / "shims").mkdir()
    (root / "versions" / f"{PY}.0" / "bin").mkdir(parents=True)
    real = root / "versions" / f"{PY}.0" / "bin" / f"python{PY}"
    real.symlink_to(os.path.realpath(sys.executable))
    (root / "version").write_text("2.7.0\n")  # selected, but not installed: the shim fails, as it does here
    pyenv = root / "libexec" / "pyenv"
    pyenv.write_text(f"""#!/bin/sh
echo ran >> {log}
shift; program=$1; shift
v=$PYENV_VERSION
if [ -z "$v" ]; then
  d=$PWD
  while :; do
    if [ -f "$d/.python-version" ]; then v=$(cat "$d/.python-version"); break; fi
    [ "$d" = / ] && break; d=$(dirname "$d")
  done
fi
[ -n "$v" ] || v=$(cat "$PYENV_ROOT/version")
[ -x "$PYENV_ROOT/versions/$v/bin/$program" ] && exec "$PYENV_ROOT/versions/$v/bin/$program" "$@"
echo "pyenv: $program: command not found" >&2; exit 127
""")
    pyenv.chmod(0o755)
    shim = root / "shims" / f"python{PY}"
    shim.write_text(f"""#!/usr/bin/env bash
set -e
[ -n "$PYENV_DEBUG" ] && set -x

program="${{0##*/}}"

export PYENV_ROOT="{root}"
exec "{root}/libexec/pyenv" exec "$program" "$@"
""")
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("PYENV_VERSION", "PYENV_DIR", "PYENV_HOOK_PATH", "PYENV_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return {"root": root, "shim": shim, "real": real, "log": log, "memo": tmp_path / "memo", "work": work}


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new `builder` process starts with: no answers kept in memory."""
    import builder.core.filememo

    monkeypatch.setattr(builder.core.filememo, "_THIS_PROCESS", {})


def test_a_pyenv_shim_is_resolved_once_to_its_interpreter(pyenv: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a shim's answer was kept for one process only: each `builder build` ran the shim (pyenv's hundreds
    of bash processes) again, three times per no-op."""
    (pyenv["root"] / "version").write_text(f"{PY}.0\n")
    shim, memo, log = pyenv["shim"], pyenv["memo"], pyenv["log"]
    first = interpreter_facts(shim, with_torch=False, memo=memo)
    assert first["executable"] == str(pyenv["real"]) and first["version"] == PY and _runs(log) == 1
    for _ in range(3):  # three more `builder build` runs
        _new_process(monkeypatch)
        assert interpreter_facts(shim, with_torch=False, memo=memo) == first
    assert _runs(log) == 1
    assert pyenv_shim_root(shim) == pyenv["root"] and pyenv_shim_root(pyenv["real"]) is None


def test_a_failing_shim_is_remembered_until_its_selection_changes(pyenv: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's case: pyenv's global version is 3.11, so `python3.12` (the shim) fails and the version is
    found under ROOT/versions instead; before, the failing shim ran again at every lookup (3 per no-op)."""
    shim, memo, log = pyenv["shim"], pyenv["memo"], pyenv["log"]
    monkeypatch.setenv("PYENV_ROOT", str(pyenv["root"]))
    monkeypatch.setenv("PATH", f"{shim.parent}:/usr/bin:/bin")
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(pyenv["work"]))
    with pytest.raises(ToolchainError, match="command not found"):
        interpreter_facts(shim, with_torch=False, memo=memo)
    assert find_interpreter(PY, memo=memo) == pyenv["real"] and _runs(log) == 1
    for _ in range(2):
        _new_process(monkeypatch)
        assert find_interpreter(PY, memo=memo) == pyenv["real"]
        with pytest.raises(ToolchainError, match="command not found"):
            interpreter_facts(shim, with_torch=False, memo=memo)
    assert _runs(log) == 1
    (pyenv["root"] / "version").write_text(f"{PY}.0\n")  # `pyenv global 3.12`: now the shim answers
    assert interpreter_facts(shim, with_torch=False, memo=memo)["executable"] == str(pyenv["real"])
    assert _runs(log) == 2


def test_whatever_selects_a_shims_interpreter_is_noticed(pyenv: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shim, memo, log, root = pyenv["shim"], pyenv["memo"], pyenv["log"], pyenv["root"]

    def ask() -> dict[str, str | None] | str:
        _new_process(monkeypatch)
        try:
            return interpreter_facts(shim, with_torch=False, memo=memo)
        except ToolchainError as e:
            return e.message

    assert "command not found" in str(ask()) and _runs(log) == 1
    monkeypatch.setenv("PYENV_VERSION", f"{PY}.0")  # `pyenv shell`
    assert isinstance(ask(), dict) and _runs(log) == 2
    assert isinstance(ask(), dict) and _runs(log) == 2
    monkeypatch.delenv("PYENV_VERSION")
    (pyenv["work"] / ".python-version").write_text(f"{PY}.0\n")  # `pyenv local`, here
    assert isinstance(ask(), dict) and _runs(log) == 3
    (pyenv["work"] / ".python-version").write_text("2.7.0\n")  # edited: another size
    assert "command not found" in str(ask()) and _runs(log) == 4
    (pyenv["work"] / ".python-version").unlink()
    (root / "versions" / "2.7.0" / "bin").mkdir(parents=True)  # `pyenv install 2.7.0`: ROOT/version's, now there
    (root / "versions" / "2.7.0" / "bin" / f"python{PY}").symlink_to(pyenv["real"])
    _bump(root / "versions")
    ask()
    assert _runs(log) == 5
    ask()
    assert _runs(log) == 5


def test_a_changed_interpreter_behind_a_remembered_shim_is_asked_again(pyenv: dict[str, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim's memo names the interpreter; that interpreter's answer is keyed on its own file, so replacing it
    (a rebuilt pyenv version) is noticed without running the shim."""
    mine = os.path.realpath(sys.executable)
    others = [Path(p) for p in [*sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3.*")), "/usr/bin/python3.11"]
              if re.fullmatch(r"python3\.\d+", Path(p).name) and Path(p).name != f"python{PY}" and os.path.isfile(p)
              and os.path.realpath(p) != mine]
    if not others:
        pytest.skip("no second Python on this machine")
    other = others[0]
    (pyenv["root"] / "version").write_text(f"{PY}.0\n")
    shim, memo = pyenv["shim"], pyenv["memo"]
    assert interpreter_facts(shim, with_torch=False, memo=memo)["version"] == PY
    other_version = interpreter_facts(other, with_torch=False)["version"]
    assert other_version != PY
    pyenv["real"].unlink()
    pyenv["real"].symlink_to(os.path.realpath(other))  # the same name, another interpreter behind it
    _new_process(monkeypatch)
    assert interpreter_facts(shim, with_torch=False, memo=memo)["version"] == other_version
    assert _runs(pyenv["log"]) == 1
