"""What a no-op build remembers instead of asking again (issue 19 item 2): each cache is reused while its files
stay as they are and asked again when they change.

Real programs throughout (a real venv made by uv, real shell scripts, the real nvcc and c++ where present). Two
stand-ins, because the real things cannot change on request here: an nvcc/compiler that is a shell script (so a test
can upgrade it), and a tiny ``torch`` package in a real venv (the real torch takes seconds to import and cannot be
reinstalled in a test); each stand-in writes a line to a log when it runs, which is what the tests count.
"""

from __future__ import annotations

import json
import os
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
from builder.toolchain.local import interpreter_facts


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
    has_build = subprocess.run([str(venv["python"]), "-c", "import build"], capture_output=True, check=False)
    assert has_build.returncode != 0  # still not there
