"""Issue 31 item 8 (part): a recipes folder outside the checkout names its patches folder with --patches (or
BUILDER_PATCHES); without it the error says where patches are looked for and how to point elsewhere."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import ROOT, assert_one_line_error, run_cli


def test_recipes_outside_the_checkout_name_their_patches_folder(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes" / "causal-conv1d", recipes / "causal-conv1d")
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_OFFLINE": "1"}
    args = ["recipes", "show", "causal-conv1d", "--version", "1.7.0", "--recipes", str(recipes)]
    missing = run_cli(*args, env=env)
    assert_one_line_error(missing, f"patch {tmp_path}/patches/causal-conv1d/0001-", "--patches DIR")
    for given in (["--patches", str(ROOT / "patches")], []):
        extra_env = {} if given else {"BUILDER_PATCHES": str(ROOT / "patches")}
        found = run_cli(*args, *given, env={**env, **extra_env})
        assert "patch 0002-stable-abi-1.7.0.patch for ==1.7.0" in found.stdout, found.stderr[-1500:]


def test_torch_table_reads_one_given_index(tmp_path: Path) -> None:
    """`builder torch-table --torch-index` shows a custom index (a local PEP 503 folder here) and only it."""
    index = tmp_path / "simple" / "torch"
    index.mkdir(parents=True)
    name = "torch-2.14.1+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    (index / "index.html").write_text(f'<a href="{name}">{name}</a>\n')
    result = run_cli("torch-table", "--torch-index", str(tmp_path / "simple"),
                     env={"BUILDER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.code == 0, result.stderr[-1500:]
    assert "custom" in result.stdout and "2.14.1" in result.stdout and "pytorch-cu128" not in result.stdout


def test_a_cuda_some_toolchain_here_provides_is_a_valid_cuda(tmp_path: Path, monkeypatch) -> None:
    """Issue 31 item 4: CUDA 13.9 (no PyPI toolkit, no image) is refused naming every source and the cure;
    a host toolkit of that line makes it valid."""
    import pytest

    from builder.core.errors import UsageError
    from builder.stages.plan import validate_cuda

    with pytest.raises(UsageError, match=r"--cuda 13.9: no toolchain here can provide CUDA 13.9") as refused:
        validate_cuda("13.9")
    assert "add 13.9 to IMAGE_CUDAS in builder/model/cuda.py" in (refused.value.hint or "")
    home = tmp_path / "cuda-13.9"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").write_text("")
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.9, V13.9.41'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert str(validate_cuda("13.9")) == "13.9"


def test_every_option_has_help_and_commands_list_only_the_flags_they_use() -> None:
    """Issue 31 item 8: no option without help; `serve` takes no --recipes, `torch-table` no --wheelhouse, doctor
    and install one wheelhouse flag (--from), `images` none of the shared flags."""
    import argparse

    from builder.cli.main import build_parser

    missing: list[str] = []
    options: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            elif not isinstance(action, argparse._HelpAction):
                options.setdefault(path, set()).update(action.option_strings)
                if action.help is None:
                    missing.append(f"{path} {action.option_strings or action.dest}")

    walk(build_parser(), "")
    assert missing == []
    assert "--recipes" not in options["serve"] and "--wheelhouse" in options["serve"]
    assert "--wheelhouse" not in options["torch-table"] and "--recipes" not in options["torch-table"]
    for command in ("doctor", "install"):
        assert "--from" in options[command] and "--wheelhouse" not in options[command]
    assert not options["images build"] & {"--cache-dir", "--wheelhouse", "--recipes", "--offline"}
    assert {"--cache-dir", "--wheelhouse", "--recipes", "--patches", "--offline"} <= options["build"]
