"""Issue 55 item 8: piped output (not a terminal, no COLUMNS) is folded at 120 characters: text at spaces with its
continuation lines indented, tables fitted, a long word (a path, a URL) kept whole, a shell command split into
lines ending in `` \\`` that a shell joins back. It had lines of up to 899 characters (coverage's matrix line,
doctor's advice, the recipes and cache tables). The real ``builder``, stdout and stderr pipes."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text

from builder.cli.common import PIPED_WIDTH, fold
from tests.helpers import ROOT
from tests.test_probe_cache import venv  # noqa: F401  (the fixture: a venv with a stand-in torch)


def piped(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``builder ARGS`` with stdout and stderr piped and no COLUMNS, as in a CI log or `| less`."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(BUILDER_CACHE_DIR=str(tmp / "cache"), BUILDER_WHEELHOUSE=str(tmp / "wheelhouse"))
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def too_long(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > PIPED_WIDTH]


@pytest.mark.parametrize("args", [
    ("recipes",),
    ("coverage", "causal-conv1d", "--offline"),  # its matrix line was 896 characters
    ("torch-table", "--offline"),
    ("cache",),
])
def test_piped_commands_keep_to_the_width(args: tuple[str, ...], tmp_path: Path) -> None:
    result = piped(*args, tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and not too_long(result.stdout) and not too_long(result.stderr)


def test_an_error_with_a_long_cure_is_folded(tmp_path: Path) -> None:
    result = piped("plan", "causal-conv1d", "--cuda", "12.8", "--arch", "120", "--offline", tmp=tmp_path)
    assert result.returncode == 4 and "error: no cached release list" in result.stderr  # no PyPI in the tests
    assert not too_long(result.stderr) and len(result.stderr.splitlines()) > 1


def test_doctor_piped_folds_its_advice_and_keeps_commands_runnable(venv: Path, tmp_path: Path) -> None:  # noqa: F811
    result = piped("doctor", "--python", str(venv), "--from", str(tmp_path / "no" / "such" / "wheelhouse"),
                   tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not too_long(result.stdout) and not too_long(result.stderr), result.stdout
    assert "2.14.1+cpu: a CPU build" in result.stdout


def test_an_error_and_its_cure_are_folded_on_stderr(tmp_path: Path) -> None:
    result = piped("install", "causal-conv1d", "--python", str(tmp_path / "nowhere" / ("x" * 40) / "bin" / "python"),
                   tmp=tmp_path)
    assert result.returncode == 2 and "error:" in result.stderr
    lines = result.stderr.splitlines()
    assert all(len(line) <= PIPED_WIDTH or " " not in line.strip() for line in lines), lines


def test_fold_breaks_at_spaces_indents_and_keeps_long_words() -> None:
    word = "/p/" + "x" * 150
    parts = [p.plain for p in fold(Text("  - " + "word " * 40 + word + " tail"), 60)]
    assert parts[0].startswith("  - word") and all(p.startswith("    ") for p in parts[1:])
    assert "    " + word in parts and all(len(p) <= 60 for p in parts if word not in p)
    assert " ".join(p.strip() for p in parts) == ("- " + "word " * 40 + word + " tail").strip()
    assert [p.plain for p in fold(Text("short"), 60)] == ["short"]


def test_a_folded_command_is_the_same_command_to_a_shell() -> None:
    command = ("uv pip install --python /tmp/some/venv/bin/python --extra-index-url "
               "file:///work/wheelhouse/channels/cu130torch2.14/simple/ 'causal-conv1d==1.7.0+cu13torch2.14' "
               "\"torch==2.14.1\" --reinstall-package causal-conv1d")
    folded = _shell_folded(command)
    lines = folded.splitlines()
    assert len(lines) > 1 and all(len(line) <= PIPED_WIDTH for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1])
    echoed = subprocess.run(["sh", "-c", "printf '%s\\n' " + folded.replace("uv pip install", "", 1)],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert echoed == shlex.split(command)[3:]  # the shell joins the lines back into the same words


def test_torchs_numpy_warning_stays_out_of_doctors_output(tmp_path: Path) -> None:
    """torch without NumPy warns "Failed to initialize NumPy" at import, and an extension built against NumPy 1.x
    prints "A module that was compiled using NumPy 1.x …" under NumPy 2: the probe keeps both to itself."""
    from builder.core.uvtool import uv_bin
    from tests.test_probe_cache import write_dist

    folder = tmp_path / "noisy"
    subprocess.run([uv_bin(), "venv", "-q", "--python", sys.executable, str(folder)], check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    write_dist(site, "torch", "2.14.1", (
        "import sys, warnings\n"
        "warnings.warn(\"Failed to initialize NumPy: No module named 'numpy' (Triggered internally at "
        "torch/csrc/utils/tensor_numpy.cpp:84.)\", UserWarning)\n"
        "print('A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.2', file=sys.stderr)\n"
        "print('A module that was compiled using NumPy 1.x (stdout)')\n"
        "__version__ = '2.14.1+cpu'\nclass version:\n    cuda = None\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n    get_arch_list = staticmethod(lambda: [])\n"))
    check = subprocess.run([str(folder / "bin" / "python"), "-c", "import torch"], capture_output=True, text=True)
    assert "Failed to initialize NumPy" in check.stderr  # the env itself is noisy
    for args in ((), ("--json",)):
        result = piped("doctor", "--python", str(folder / "bin" / "python"), "--refresh", *args, tmp=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "NumPy" not in result.stdout + result.stderr, result.stdout + result.stderr
        assert "2.14.1+cpu" in result.stdout


def test_a_placeholder_with_a_lone_quote_loses_no_character() -> None:
    command = ("builder build causal-conv1d --cuda 13.0 --arch <your GPU's arch: none here to take it from> "
               "--python 3.11 --torch 2.14.1 --no-torch-range --replace --jobs 2")
    folded = _shell_folded(command)
    assert "".join(folded.replace(" \\\n", " ").split()) == "".join(command.split())


def test_a_quoted_arch_placeholder_folds_into_the_same_words() -> None:
    """The placeholder printed where no GPU gives the arch is quoted (an unquoted ``<`` is a shell redirection): a
    shell reads the folded command as the same words, the placeholder one of them."""
    command = ("builder build causal-conv1d --cuda 13.0 --arch \"<your GPU's arch: none here to take it from>\" "
               "--python 3.11 --torch 2.14.1 --no-torch-range --replace --jobs 2")
    folded = _shell_folded(command)
    echoed = subprocess.run(["sh", "-c", "printf '%s\\n' " + folded.replace("builder build", "", 1)],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert echoed == shlex.split(command)[2:]
    assert "<your GPU's arch: none here to take it from>" in echoed


def _shell_folded(command: str) -> str:
    """``command`` as the piped console folds it (builder.cli.common.shell_folded, in a process with no COLUMNS)."""
    code = "from builder.cli.common import shell_folded; import sys; print(shell_folded(sys.argv[1], '    '))"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True, env=env, cwd=ROOT,
                          check=True).stdout
