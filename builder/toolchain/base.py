"""The toolchain seam: what every toolchain hands to the stages.

A toolchain is a CUDA toolkit (``CudaToolkit``: a CUDA home with a working nvcc of a known version) and a
``BuildHost``: where the build's commands run. pip and host toolchains run them on this machine
(toolchain/local.py ``LocalRunner``); the docker toolchain runs them in a container of its build image
(toolchain/container.py ``ContainerToolchain``). The stages (pyenv: the build venv; compile: the wheel) call only
this Protocol, so they have one code path for every toolchain. Where a toolchain brings the build's Python and
torch itself (the docker toolchain: cibuildwheel installs the pinned torch in its container), ``prepare_python``
says so and the pyenv stage makes no venv; what it answers travels to ``build_wheel`` in the ``WheelRequest``
(``prepared``), so a host keeps no state between the two. docs/ARCHITECTURE.md "The toolchain seam" says how
to add one.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, TextIO

from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.filememo import remembered
from builder.model.arch import parse_nvcc_version
from builder.model.cuda import CudaVersion
from builder.toolchain.cibw import TorchCache

# ptxas threads per nvcc call: a constant, not the machine's core count, because ptxas writes its command line
# (``-split-compile 8``) into every cubin: a count that followed the machine would give other bytes on another one.
# 8: past it the critical file gains little (BENCHMARKS section 9); where cores are fewer the threads share them.
PTXAS_THREADS = 8


@dataclass(frozen=True)
class CudaToolkit:
    """A usable CUDA toolkit. ``kind`` is pip, host or docker; ``version`` is nvcc's full version."""

    kind: str
    cuda_home: Path
    version: Version
    reason: str = ""
    image: str = ""  # docker toolchain: the build image's tag, content ID and registry digest
    image_id: str = ""
    image_digest: str = ""

    @property
    def nvcc(self) -> Path:
        return self.cuda_home / "bin" / "nvcc"

    def build_env(self, base_path: str) -> dict[str, str]:
        """Variables that point torch's cpp_extension and setup.py scripts at this toolkit."""
        return {
            "CUDA_HOME": str(self.cuda_home),
            "CUDA_PATH": str(self.cuda_home),
            "PATH": f"{self.cuda_home / 'bin'}:{base_path}",
        }

    def describe(self) -> str:
        where = f" in {self.image}" if self.image else ""
        return f"{self.kind} (nvcc {self.version} at {self.cuda_home}{where})"

    @property
    def nvcc_flags(self) -> tuple[str, ...]:
        """The builder's nvcc flags with every default on (``nvcc_flags_for``)."""
        return self.nvcc_flags_for()

    def nvcc_flags_for(self, *, ptxas_split: bool = True) -> tuple[str, ...]:
        """Flags the builder gives every nvcc call (NVCC_APPEND_FLAGS, before the recipe's own, so a recipe's
        value wins): ``-frandom-seed`` makes the front end's internal symbol names (``_INTERNAL_…_<n>``, else
        numbered by process ID) the same in every build; ``--compress-mode=size`` halves the fatbins and loads
        faster than nvcc's default (docs/BENCHMARKS.md, "Compressed fatbins"); ptxas's split compilation
        (``ptxas_split``, a recipe's ``[build] ptxas-split``) runs ptxas on a file's kernels in PTXAS_THREADS
        threads and gives the same SASS as without it (BENCHMARKS section 9). nvcc's own ``--split-compile``
        (cicc too) is not used: its SASS changes from run to run. All checked with nvcc 13.0; CUDA 12.x
        toolkits get none (not verified there)."""
        if self.version.major < 13:
            return ()
        flags = ("-frandom-seed=cuda-wheel-builder", "--compress-mode=size")
        return (*flags, f"--ptxas-options=--split-compile={PTXAS_THREADS}") if ptxas_split else flags

    def record(self, *, ptxas_split: bool = True) -> dict[str, str]:
        record = {"kind": self.kind, "cuda_home": str(self.cuda_home), "nvcc": str(self.version), "reason": self.reason}
        if flags := self.nvcc_flags_for(ptxas_split=ptxas_split):  # in the cache key (stages/inputs.py)
            record["nvcc_flags"] = " ".join(flags)
        if self.image:
            record.update(image=self.image, image_id=self.image_id, image_digest=self.image_digest)
        return record

    def with_reason(self, reason: str) -> CudaToolkit:
        return replace(self, reason=reason)


@dataclass(frozen=True)
class RunResult:
    """A finished command: its exit code and its output (stdout and stderr together; empty when it was streamed
    to a log file instead)."""

    code: int
    output: str = ""


@dataclass(frozen=True)
class PreparedPython:
    """The build's Python as a host that brings its own provides it (``BuildHost.prepare_python``): paths as the
    build's commands see them; ``torch`` and ``torch_cuda`` are what ``torch.__version__`` and
    ``torch.version.cuda`` of the torch the build installs say; ``fetched`` is that torch and the build
    requirements, already fetched, which the build installs offline."""

    python: Path
    version: str  # "3.12": the CPython a frontend such as cibuildwheel selects
    torch: str  # e.g. "2.14.1+cu130"
    torch_cuda: str | None
    purelib: Path
    fetched: TorchCache


@dataclass(frozen=True, kw_only=True)
class WheelRequest:
    """Everything a toolchain needs to build one wheel from a patched source tree (``BuildHost.build_wheel``)."""

    source_dir: Path
    python: Path  # the build's interpreter as its commands see it: a venv, or the image's CPython (with the torch)
    env: Mapping[str, str]  # the build's whole environment (CUDA_HOME, TORCH_CUDA_ARCH_LIST, MAX_JOBS, ...)
    out_dir: Path
    log_file: Path  # every line of the build's output goes here
    prepared: PreparedPython | None = None  # what the host's prepare_python answered; None: a venv made here


class WheelBuildFailed(Exception):
    """A build frontend finished without a wheel; the compile stage turns it into BuildFailed with the log's tail."""


Mounts = Mapping[Path, bool]  # host path -> read-only; where a command runs elsewhere, it sees these paths
NO_MOUNTS: Mounts = MappingProxyType({})


class BuildHost(Protocol):
    """Where a build's commands run. Used as a context manager: ``__exit__`` releases what it holds."""

    @property
    def toolkit(self) -> CudaToolkit | None:
        """None for a pure-Python build (read-only here, so that a host that always has one may say so)."""
        ...

    where: str  # "" on this machine, " in <container image>" elsewhere: appended to log lines as it is

    def __enter__(self) -> BuildHost: ...

    def __exit__(self, *exc: object) -> None: ...

    def close(self) -> None: ...

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
            mounts: Mounts = NO_MOUNTS, network: bool = True, out: TextIO | None = None,
            on_line: Callable[[str], None] | None = None, timeout_s: float | None = None) -> RunResult:
        """Run argv; with ``out`` its output is written there as it comes (and not returned), each non-empty
        line also goes to ``on_line``. ``mounts`` and ``network=False`` bind where the command runs elsewhere."""
        ...

    def path(self, host_path: Path) -> Path:
        """The path under which the build's commands see ``host_path``."""
        ...

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment a build starts from (``environ`` is this process's)."""
        ...

    def prepare_python(self, version: str, torch: str, index_url: str,
                       requirements: Sequence[str]) -> PreparedPython | None:
        """None: the pyenv stage makes a build venv with torch==``torch`` on this machine. Otherwise the host
        brings the interpreter of Python ``version`` and installs the pinned torch and ``requirements`` itself
        when it builds (fetched now, so that the build needs no network); the answer names what it will be."""
        ...

    def given_python(self, python: Path) -> Path:
        """``--python PATH``: the interpreter to build with, or a ToolchainError where this host cannot."""
        ...

    def host_compiler(self, env: Mapping[str, str]) -> dict[str, str] | None:
        """The C/C++ compiler ``env`` selects, named for the cache key; None where the toolkit brings its own."""
        ...

    def build_wheel(self, request: WheelRequest, on_line: Callable[[str], None]) -> Path:
        """Build the wheel ``request`` asks for; output lines go to ``request.log_file`` and ``on_line``. Raises
        WheelBuildFailed when no wheel came out (the compile stage summarises the log, the same for every host)."""
        ...


@dataclass(frozen=True)
class ToolchainChoice:
    """The outcome of selection, kept for the plan even when no toolkit could be found."""

    requested: str
    toolkit: CudaToolkit | None
    image: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    host: BuildHost | None = None  # where the build runs (close it after); select_toolkit always sets it


# Run by an interpreter to report its version, paths and torch (``--no-torch``: skip the slow torch import).
PYTHON_PROBE = r"""
import json, sys, sysconfig
info = {"version": "%d.%d" % sys.version_info[:2], "full": sys.version.split()[0],
        "executable": sys.executable, "purelib": sysconfig.get_paths()["purelib"], "torch": None, "torch_cuda": None}
try:
    if "--no-torch" in sys.argv:
        raise ImportError("not probed")
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["torch_dir"] = torch.__path__[0]
except Exception as e:
    info["torch_error"] = repr(e)[:200]
print(json.dumps(info))
"""


_PROBE_FIELDS = {"version": (str,), "executable": (str,), "purelib": (str,), "torch": (str, type(None)),
                 "torch_cuda": (str, type(None)), "torch_error": (str, type(None))}


PROBE_OUTPUT_LIMIT = 1 << 20  # what an interpreter may print answering PYTHON_PROBE (a few hundred bytes is usual)


def probe_answer(line: str, python: Path, output: str = "") -> dict[str, Any]:
    """The probe's JSON answer (PYTHON_PROBE), its fields checked: a ToolchainError naming the field otherwise."""
    cure = "give a working Python interpreter (VENV/bin/python, or a venv folder)"
    try:
        info = json.loads(line) if line else None
    except (ValueError, RecursionError):
        info = None
    if not isinstance(info, dict):
        raise ToolchainError(f"--python {python}: its answer to the environment probe is not a JSON object: "
                             f"{tail(output or line)}", cure)
    for name, types in _PROBE_FIELDS.items():
        if name == "torch_error" and name not in info:
            continue
        if not isinstance(info.get(name), types) or (name in ("version", "purelib", "executable")
                                                       and not info[name]):
            got = "missing" if name not in info else f"{type(info[name]).__name__} {str(info[name])[:40]!r}"
            raise ToolchainError(f"--python {python}: its answer to the environment probe has field {name!r} "
                                 f"{got}, not {' or '.join('null' if t is type(None) else 'a string' for t in types)}",
                                 cure)
    if not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,3}", info["version"]):
        raise ToolchainError(f"--python {python}: its answer to the environment probe names version "
                             f"{info['version'][:40]!r}, not MAJOR.MINOR", cure)
    return info


def tail(output: str) -> str:
    """The end of a program's output on one line."""
    text = " ".join(output.split())
    return (text[-200:] if len(text) > 200 else text) or "(nothing printed)"


def nvcc_version(nvcc: Path, memo: Path | None = None) -> Version:
    """Run ``nvcc --version`` and return e.g. 13.0.88; a ToolchainError if it does not run. With ``memo`` (a
    folder) the answer is remembered keyed by nvcc's file identity (core/filememo.py)."""
    return Version(remembered(memo, "nvcc", [nvcc], ["--version"], lambda: str(_ask_nvcc(nvcc))))


def _ask_nvcc(nvcc: Path) -> Version:
    try:
        result = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"{nvcc} does not run: {e}") from e
    version = parse_nvcc_version(result.stdout)
    if result.returncode != 0 or version is None:
        raise ToolchainError(f"{nvcc} --version failed: {(result.stderr or result.stdout).strip()[-200:]}")
    return version


def same_minor(a: Version | CudaVersion, b: Version | CudaVersion) -> bool:
    return (a.major, a.minor) == (b.major, b.minor)
