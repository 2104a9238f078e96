"""How a user's interpreter runs here: ``--python`` resolved (a venv folder → its bin/python), its platform read
from its ELF header, and the argv that runs it (itself, or under qemu-user with its sysroot for another CPU's env)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from builder.core.elf import elf_machine
from builder.core.errors import UsageError
from builder.model.platform import PLATFORMS, Platform, this_machine
from builder.toolchain.cross import find_qemu


def interpreter_platform(python: Path) -> Platform | None:
    """The platform an interpreter's ELF header names (read, not run); None for a script or another CPU's ELF."""
    machine = elf_machine(python.resolve())
    return PLATFORMS.get(machine) if machine else None


def interpreter_argv(python: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """How to run ``python`` here: itself, or under qemu-user where its ELF is another platform's (an aarch64 env on
    this x86_64 machine). qemu finds that env's loader and libraries in the sysroot the interpreter lives in (``-L``:
    the folder above it holding ``lib/ld-linux-aarch64.so.1``, as in the cross build's ``sysroots/``), else through
    QEMU_LD_PREFIX; with no qemu here the interpreter is run as it is (binfmt_misc may still run it, else the probe
    says it cannot run)."""
    platform = interpreter_platform(python)
    if platform is None or platform == this_machine():
        return [str(python)]
    environ = env if env is not None else os.environ
    path = environ.get("PATH")
    qemu = find_qemu(platform, path)
    if qemu is None:
        return [str(python)]
    sysroot = None if environ.get("QEMU_LD_PREFIX") else _sysroot_of(python, platform)
    return [qemu, *(["-L", str(sysroot)] if sysroot else []), str(python)]


_LOADERS = {"aarch64": "lib/ld-linux-aarch64.so.1", "x86_64": "lib64/ld-linux-x86-64.so.2"}


def _sysroot_of(python: Path, platform: Platform) -> Path | None:
    """The folder an unpacked interpreter of ``platform`` lives in (SYSROOT/usr/bin/python3.11 → SYSROOT): the
    nearest one above it that holds that platform's dynamic loader; None where it is installed at /."""
    for folder in python.resolve().parents:
        if folder == Path("/"):
            return None
        if (folder / _LOADERS[platform.name]).exists():
            return folder
    return None


def cannot_run_cure(python: Path) -> str:
    platform = interpreter_platform(python)
    if platform is not None and platform != this_machine():
        return (f"it is an {platform} interpreter and this machine is {this_machine()}: install qemu-user-static "
                f"({platform.qemu}) and set QEMU_LD_PREFIX to that env's sysroot, so it runs under qemu")
    return "pass --python with a working interpreter (VENV/bin/python)"


def resolve_interpreter(python: Path) -> Path:
    """``python`` itself, or ``python/bin/python`` for a venv folder; UsageError when neither exists."""
    if python.is_dir():
        candidate = python / "bin" / "python"
        if candidate.exists():
            return candidate
        raise UsageError(f"--python {python}: a folder without bin/python", "give a venv folder or its bin/python")
    if not python.exists():
        raise UsageError(f"--python {python}: no such interpreter", "give a venv folder or its bin/python")
    return python
