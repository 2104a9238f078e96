"""The CPU platform axis (model/platform.py) and the parts of a cross build that need no compiler (toolchain/cross.py).

The cross build itself, nvcc and qemu included, is tests/test_cross_build.py (integration tier)."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.core.elf import elf_machine
from builder.core.errors import ToolchainError, UsageError
from builder.core.settings import Settings
from builder.model.abi import StableAbi
from builder.model.arch import parse_arch_list
from builder.model.platform import (
    AARCH64,
    X86_64,
    check_archs_for_platform,
    of_wheel_platform,
    parse_platform,
)
from builder.model.records import BuildRecord
from builder.stages.inputs import recorded_inputs
from builder.stages.torchrange import _check_one
from builder.toolchain import cross
from builder.user.targetenv import env_platform
from tests.helpers import run_cli


def _elf(path: Path, machine: int) -> Path:
    """A 64-bit little-endian ELF header for ``machine`` (0x3E x86-64, 0xB7 AArch64): all elf_machine reads."""
    head = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (3).to_bytes(2, "little") + machine.to_bytes(2, "little")
    path.write_bytes(head + b"\0" * 44)
    return path


def test_platform_names_and_aliases() -> None:
    assert parse_platform("aarch64") is AARCH64 and parse_platform("arm64") is AARCH64
    assert parse_platform("sbsa") is AARCH64 and parse_platform("manylinux_2_28_aarch64") is AARCH64
    assert parse_platform("amd64") is X86_64 and parse_platform("linux_x86_64") is X86_64
    with pytest.raises(UsageError) as e:
        parse_platform("riscv64")
    assert e.value.message == "--platform: 'riscv64' is not a platform the builder knows"
    assert e.value.hint == "use one of x86_64, aarch64"
    assert AARCH64.manylinux_tag == "manylinux_2_28_aarch64" and AARCH64.uv_platform == "aarch64-manylinux_2_28"
    assert of_wheel_platform("manylinux_2_24_aarch64") is AARCH64 and of_wheel_platform("any") is None


def test_each_platform_refuses_the_archs_its_machines_never_carry() -> None:
    with pytest.raises(UsageError) as e:
        check_archs_for_platform(parse_arch_list("90,121"), X86_64)
    assert "no x86_64 machine carries sm_121 (DGX Spark / GB10 is aarch64)" in e.value.message
    assert "--platform aarch64" in str(e.value.hint) and "90,100,103,120" in str(e.value.hint)
    with pytest.raises(UsageError, match="Jetson Orin"):
        check_archs_for_platform(parse_arch_list("87"), AARCH64)
    check_archs_for_platform(parse_arch_list("90,100,103,110,121"), AARCH64)  # GH200 … DGX Spark
    check_archs_for_platform(parse_arch_list(",".join(map(str, X86_64.default_archs))), X86_64)
    assert 121 not in X86_64.default_archs and 121 in AARCH64.default_archs


def test_elf_machine_and_the_env_platform_read_from_the_interpreter(tmp_path: Path) -> None:
    arm = _elf(tmp_path / "python-arm", 0xB7)
    assert elf_machine(arm) == "aarch64" and elf_machine(_elf(tmp_path / "x", 0x3E)) == "x86_64"
    assert elf_machine(_elf(tmp_path / "riscv", 0xF3)) == "em-243"
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    assert elf_machine(script) is None
    link = tmp_path / "venv-python"
    link.symlink_to(arm)  # a venv's python is a link to the real interpreter
    assert env_platform(link) is AARCH64
    with pytest.raises(UsageError, match="em-243"):
        env_platform(tmp_path / "riscv")


def test_build_refuses_sm121_for_x86_64_before_any_work(tmp_path: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wh")}
    result = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120,121", "--platform", "x86_64",
                     "--offline", env=env)
    assert result.code == 2, result.stderr
    assert result.error_lines == ["error: --arch 121 for --platform x86_64: no x86_64 machine carries sm_121 "
                                  "(DGX Spark / GB10 is aarch64) (build it with --platform aarch64, or leave it out; "
                                  "x86_64 defaults to --arch 90,100,103,120)"]
    assert not (tmp_path / "wh").exists()


def test_the_platform_enters_the_key_and_the_record_only_off_x86_64() -> None:
    record = BuildRecord(package="p", version="1", cuda="13.0", archs=("121",), platform="aarch64")
    back = BuildRecord.from_json(record.to_json())
    assert back.platform == "aarch64" and back.target_platform == "aarch64"
    assert recorded_inputs(back).platform == "aarch64"
    old = BuildRecord(package="p", version="1", cuda="13.0", archs=("120",))
    assert "platform" not in old.to_json() and old.target_platform == "x86_64"
    keys = replace(recorded_inputs(old), env=()).as_json()  # env: the recipe's digest covers it
    assert "platform" not in keys  # an x86_64 build's cache key is what it was before the axis
    assert replace(recorded_inputs(back), env=()).as_json()["platform"] == "aarch64"


def _fake_tools(tmp_path: Path) -> cross.CrossTools:
    return cross.CrossTools(AARCH64, Path("/usr/bin/aarch64-linux-gnu-gcc"), Path("/usr/bin/aarch64-linux-gnu-g++"),
                            Path("/usr/bin/qemu-aarch64-static"))


def test_cross_build_env_points_compilers_headers_and_libraries_at_the_target(tmp_path: Path) -> None:
    sysroot = tmp_path / "sysroot"
    (sysroot / "usr" / "include" / "python3.11").mkdir(parents=True)
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(b"")
    cross._link_unversioned(cross.TargetSite(site, "2.11.0"))
    assert os.readlink(site / ".builder-link" / "libcudart.so") == "../nvidia/cu13/lib/libcudart.so.13"
    env = cross.build_env(_fake_tools(tmp_path), cross.TargetPython(sysroot, "3.11"), cross.TargetSite(site, "2.11.0"),
                          Path("/cuda"), abi3=True, python_version="3.12")
    assert env["CXX"].endswith("aarch64-linux-gnu-g++") and env["LDSHARED"].endswith("aarch64-linux-gnu-g++ -shared")
    assert env["_PYTHON_HOST_PLATFORM"] == "linux-aarch64" and "SETUPTOOLS_EXT_SUFFIX" not in env  # abi3: .abi3.so
    assert env["CFLAGS"].split()[:2] == [f"-I{sysroot}/usr/include/python3.11", f"-I{sysroot}/usr/include"]
    assert f"-include {sysroot}/builder-glibc228.h" in env["CFLAGS"]
    assert env["NVCC_PREPEND_FLAGS"] == env["CFLAGS"] + " -I/cuda/include -isystem /cuda/include/cccl"
    assert env["LDFLAGS"].split()[0] == f"-L{site}/torch/lib"
    assert "__libc_single_threaded" in (sysroot / "builder-glibc228.h").read_text()
    per_version = cross.build_env(_fake_tools(tmp_path), cross.TargetPython(sysroot, "3.11"),
                                  cross.TargetSite(site, "2.11.0"), Path("/cuda"), abi3=False,
                                  python_version="3.11")
    assert per_version["SETUPTOOLS_EXT_SUFFIX"] == ".cpython-311-aarch64-linux-gnu.so"


def test_a_missing_cross_compiler_is_one_line_with_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as e:
        cross.find_tools(AARCH64, {"PATH": str(tmp_path)})
    assert "aarch64-linux-gnu-gcc, aarch64-linux-gnu-g++, qemu-aarch64 (or qemu-aarch64-static)" in e.value.message
    assert "apt-get install g++-aarch64-linux-gnu, and qemu-user from bookworm-backports" in str(e.value.hint)


def test_the_test_python_runs_the_target_interpreter_under_qemu_with_the_site(tmp_path: Path) -> None:
    python = cross.TargetPython(tmp_path / "sysroot", "3.11")
    script = cross.test_python(tmp_path / "env", _fake_tools(tmp_path), python, tmp_path / "site")
    text = script.read_text()
    assert script.stat().st_mode & stat.S_IXUSR
    assert f"PYTHONPATH='{tmp_path / 'site'}'" in text
    assert f"'/usr/bin/qemu-aarch64-static' '-L' '{tmp_path / 'sysroot'}' '{python.executable}' \"$@\"" in text


def test_a_torch_that_crashes_by_itself_is_named_not_blamed_on_the_wheel(tmp_path: Path) -> None:
    """PyPI's aarch64 torch 2.13+ segfaults in torch._C's init under Debian 12's qemu 7.2: the check says torch
    crashed before the wheel loaded (and it stays failed: nothing is offered for that torch)."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"stage": "torch"}\'\necho "qemu: uncaught target signal 11" >&2\nexit 139\n')
    fake.chmod(0o755)
    stable = StableAbi(SpecifierSet(), Version("2.11"), ("tinyext",))
    check = _check_one(stable, ("tinyext",), "2.14.1", "13.0", lambda torch, folder: fake, tmp_path / "env")
    assert check.status == "failed" and not check.passed
    assert check.detail.startswith("torch 2.14.1 itself crashed on import, before the wheel was loaded (exit 139")


def test_cross_site_is_cached_per_torch_platform_and_python(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=tmp_path,
                        patches_dir=tmp_path)
    folder = settings.cache("targets") / "torch-2.11.0-aarch64-py3.11"
    folder.mkdir(parents=True)
    (folder / cross.MARKER).write_text("{}")  # provisioned before: no uv call (the unit tier has no network)
    site = cross.provision_site(AARCH64, "2.11.0", "3.11", [], settings)
    assert site.folder == folder and site.torch_lib == folder / "torch" / "lib"


def test_build_with_an_interpreter_of_another_platform_is_refused_before_running_it(tmp_path: Path) -> None:
    arm = _elf(tmp_path / "python3.11", 0xB7)
    arm.chmod(0o755)
    result = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "121", "--python", str(arm), "--offline",
                     env={"BUILDER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.code == 2, result.stderr
    assert result.error_lines == [f"error: --python {arm}: an aarch64 interpreter, which cannot run this machine's "
                                  "build (cross-build with --platform aarch64 --python 3.X (a version: the build runs "
                                  "here, the import test in Debian's aarch64 Python under qemu))"]


def test_a_platform_that_crossed_a_process_boundary_keys_the_same() -> None:
    """The farm's workers get their targets pickled: an x86_64 Platform equal to X86_64 but not the same object must
    key and record like X86_64 (a build in a worker and the farm's check in the parent agree on "unchanged"; an
    identity check once keyed worker builds with a platform)."""
    import pickle
    from types import SimpleNamespace

    from builder.model.recipe import RecipeKind
    from builder.stages.plan import Plan

    def recorded(platform: object, kind: RecipeKind) -> str | None:
        plan = SimpleNamespace(target=SimpleNamespace(platform=platform), recipe=SimpleNamespace(kind=kind))
        return Plan.recorded_platform.fget(plan)  # type: ignore[attr-defined]

    copy = pickle.loads(pickle.dumps(X86_64))
    assert copy == X86_64 and copy is not X86_64
    assert recorded(copy, RecipeKind.CUDA_EXTENSION) is None and recorded(X86_64, RecipeKind.CUDA_EXTENSION) is None
    assert recorded(pickle.loads(pickle.dumps(AARCH64)), RecipeKind.CUDA_EXTENSION) == "aarch64"
    assert recorded(AARCH64, RecipeKind.PURE_PYTHON) is None  # one pure-Python wheel serves every platform


def _qemu(path: Path, version: str | None) -> Path:
    answer = f'echo "{path.name.split("-static")[0]} version {version} (Debian 1:{version}+ds-1)"' if version else "exit 1"
    path.write_text(f"#!/bin/sh\n{answer}\n")
    path.chmod(0o755)
    return path


def test_qemu_is_found_by_what_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """qemu 10 (Debian's qemu-user) names its binary qemu-aarch64, qemu-user-static qemu-aarch64-static; binfmt_misc
    may register either: the newest that answers as qemu wins, a binfmt wrapper that does not is ignored."""
    from builder.toolchain import cross

    monkeypatch.setattr(cross, "BINFMT", tmp_path / "binfmt")
    (tmp_path / "binfmt").mkdir()
    only_static, both, none = (tmp_path / n for n in ("only-static", "both", "none"))
    for folder in (only_static, both, none):
        folder.mkdir()
    static = _qemu(only_static / "qemu-aarch64-static", "7.2.0")
    assert cross.find_qemu(AARCH64, str(only_static)) == str(static)
    _qemu(both / "qemu-aarch64-static", "7.2.0")
    new = _qemu(both / "qemu-aarch64", "10.0.2")
    assert cross.find_qemu(AARCH64, str(both)) == str(new), "the newest: Debian 12's 7.2 crashes in torch >= 2.13"
    assert cross.find_qemu(AARCH64, str(none)) is None
    registered = _qemu(tmp_path / "qemu-aarch64-static", "8.2.0")
    (tmp_path / "binfmt" / "qemu-aarch64").write_text(f"enabled\ninterpreter {registered}\nflags: OCF\n")
    assert cross.find_qemu(AARCH64, str(none)) == str(registered)
    wrapper = _qemu(tmp_path / "aarch64-binfmt-P", None)
    (tmp_path / "binfmt" / "qemu-aarch64").write_text(f"enabled\ninterpreter {wrapper}\nflags: POCF\n")
    assert cross.find_qemu(AARCH64, str(none)) is None, "a binfmt wrapper that does not answer as qemu"
