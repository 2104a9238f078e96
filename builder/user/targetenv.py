"""Targets inferred from where they will run: ``--cuda`` from the torch of ``--python PATH``, ``--arch`` from
the GPUs of this machine. Explicit flags win, and are checked against the env they name."""

from __future__ import annotations

import shutil
from pathlib import Path

from builder.core.elf import elf_machine
from builder.core.errors import ToolchainError, UsageError
from builder.core.log import log
from builder.model.arch import Arch, format_arch_list, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import PLATFORMS, Platform, this_machine
from builder.model.python import PythonSpec
from builder.stages.pyenv import find_interpreter, probe
from builder.user.machine import query_driver


def resolve_python(python: PythonSpec) -> Path:
    """``--python PATH`` (or a command on PATH) as an interpreter that exists, else a usage error (exit 2)."""
    check_python_flag(python)
    return Path(shutil.which(python.text) or python.text)


def check_python_flag(python: PythonSpec, memo: Path | None = None) -> None:
    """``--python`` names an interpreter that exists here (a build needs one; ``plan`` only reports it).

    A version is looked up like the build would (PATH, pyenv, uv-managed); a path must exist. Whether that
    interpreter has torch is checked by the build itself (importing torch takes seconds)."""
    if python.is_path:
        if not Path(shutil.which(python.text) or python.text).is_file():
            raise UsageError(f"--python {python}: no such interpreter", "give a path to a python executable, "
                             "e.g. /path/to/venv/bin/python, or a version such as 3.12")
        return
    try:
        find_interpreter(python.text, memo=memo)  # memo: its answer is remembered keyed by the interpreter's file
    except ToolchainError as e:
        raise UsageError(e.message, e.hint) from e




def env_platform(python: Path | str) -> Platform:
    """The CPU platform of the interpreter ``python`` names (read from its ELF header, so an aarch64 env is told
    without running it under qemu); this machine's where the file is a script or not an ELF."""
    path = Path(shutil.which(str(python)) or python)
    machine = elf_machine(path.resolve()) if path.exists() else None
    if machine is None:
        return this_machine()
    if machine not in PLATFORMS:
        raise UsageError(f"--python {python}: its interpreter is an ELF for {machine}, not a platform the builder "
                         "knows", f"use an interpreter for one of {', '.join(PLATFORMS)}")
    return PLATFORMS[machine]


def infer_cuda(cuda: str | None, python: PythonSpec) -> str:
    """``--cuda`` as given (checked against an interpreter's torch), or that torch's CUDA."""
    if not python.is_path:
        if cuda is None:
            raise UsageError("--cuda is required: it names the CUDA of the compiler and of the torch to build against",
                             "e.g. --cuda 13.0 (`builder torch-table` lists each CUDA's torches), or --python "
                             "/path/to/venv/bin/python to take it from that env's torch")
        return cuda
    interpreter = resolve_python(python)
    try:
        env = probe(interpreter)
    except ToolchainError as e:
        raise UsageError(e.message, e.hint) from e
    if env.torch is None:
        if cuda is not None:
            return cuda
        raise UsageError(f"--python {python}: torch is not installed there, so its CUDA is unknown",
                         "install the torch the wheel is for into that env, or pass --cuda")
    if env.torch_cuda is None:
        raise UsageError(f"--python {python}: its torch {env.torch} is a CPU build; a CUDA extension needs a CUDA torch",
                         "install a CUDA build of torch there (e.g. torch 2.14.1 from PyPI is CUDA 13.0)")
    have = CudaVersion.parse(env.torch_cuda).line
    if cuda is not None and ".".join(cuda.split(".")[:2]) != have:
        raise UsageError(f"--cuda {cuda} but the torch {env.torch} in {python} is a CUDA {have} build",
                         f"use --cuda {have} (or leave --cuda out), or an env whose torch is CUDA {cuda}")
    if cuda is None:
        log.info(f"--cuda {have}: the CUDA of torch {env.torch} in {python}")
    return cuda or have


def infer_archs(arch: str | None, *, required: bool) -> tuple[Arch, ...]:
    """``--arch`` as given; ``native`` (or nothing, when a GPU is present) → this machine's GPUs."""
    if arch is not None and arch.strip().lower() != "native":
        return parse_arch_list(arch)
    if arch is None and not required:
        return ()
    driver = query_driver()
    if driver.gpus:
        archs = parse_arch_list(",".join(str(g.cc) for g in driver.gpus))
        log.info(f"--arch {format_arch_list(archs)}: this machine's GPUs "
                 f"({', '.join(f'{g.name} sm_{g.sm}' for g in driver.gpus)})")
        return archs
    if arch is not None:
        raise UsageError(f"--arch native: no GPU visible here ({driver.error or 'nvidia-smi lists none'})",
                         "name the archs, e.g. --arch 120 (RTX 50xx / RTX PRO 6000), --arch 90 (H100/H200)")
    raise UsageError("--arch is required (no GPU here to take it from)",
                     "e.g. --arch 120 (RTX 50xx / RTX PRO 6000 Blackwell), --arch 90 (H100/H200), --arch 121 (GB10)")
