"""The Python side of a build: find interpreters (also those not on PATH), make venvs with the pinned torch.

A managed build venv is created with uv once per (interpreter, torch, index, build requirements) and reused.
``--python PATH`` builds against an existing interpreter and the torch already installed there.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv, warn_if_low_disk
from builder.discovery.compat import TorchIndex

_PROBE = r"""
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


@dataclass(frozen=True)
class PythonEnv:
    """An interpreter the build runs with, and the torch it holds (None when torch is absent)."""

    python: Path
    version: str
    torch: str | None
    torch_cuda: str | None
    purelib: Path
    managed: bool
    executable: Path | None = None  # the real interpreter behind a shim or venv link

    def record(self) -> dict[str, str | None]:
        return {"python": str(self.python), "version": self.version, "torch": self.torch, "torch_cuda": self.torch_cuda}


def probe(python: Path, *, need_torch: bool = False, with_torch: bool = True) -> PythonEnv:
    """Ask an interpreter for its version and torch (import torch can take a few seconds)."""
    try:
        argv = [str(python), "-c", _PROBE] + ([] if with_torch or need_torch else ["--no-torch"])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"--python {python}: cannot run it: {e}") from e
    if result.returncode != 0:
        raise ToolchainError(f"--python {python}: it fails to start: {result.stderr.strip()[-200:]}")
    info = json.loads(result.stdout.strip().splitlines()[-1])
    if need_torch and not info["torch"]:
        raise ToolchainError(
            f"--python {python}: torch is not importable there ({info.get('torch_error', 'not installed')})",
            "install the torch you want the wheel built against into that environment",
        )
    return PythonEnv(python, info["version"], info["torch"], info["torch_cuda"], Path(info["purelib"]), False,
                     Path(info["executable"]))


def find_interpreter(version: str, extra_dirs: Iterable[Path] = ()) -> Path:
    """A base interpreter for Python ``version`` (3.12): PATH, pyenv, uv-managed, or a clear error."""
    looked: list[str] = []
    for candidate in _interpreter_candidates(version, extra_dirs, looked):
        try:
            found = probe(candidate, with_torch=False)
        except ToolchainError:
            continue
        if found.version == version:
            return found.executable or candidate
    raise ToolchainError(
        f"no Python {version} interpreter found (looked: {', '.join(looked)})",
        f"install one (`uv python install {version}` or pyenv) or pass --python /path/to/python{version}",
    )


def _interpreter_candidates(version: str, extra_dirs: Iterable[Path], looked: list[str]) -> list[Path]:
    found: list[Path] = []
    looked.append(f"python{version} on PATH")
    if on_path := shutil.which(f"python{version}"):
        found.append(Path(on_path))
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    looked.append(f"pyenv ({pyenv_root}/versions)")
    found += [Path(p) for p in sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"), reverse=True)]
    uv_dir = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or Path.home() / ".local/share/uv/python")
    looked.append(f"uv-managed ({uv_dir})")
    found += [Path(p) for p in sorted(glob.glob(f"{uv_dir}/cpython-{version}.*/bin/python{version}"), reverse=True)]
    for directory in extra_dirs:
        looked.append(str(directory))
        found += [Path(p) for p in glob.glob(f"{directory}/python{version}")]
    return [p for p in found if p.exists()]


def _index_args(index: TorchIndex) -> list[str]:
    # uv gives --extra-index-url priority over the default index, so torch comes from the torch index.
    return [] if index.name == "pypi" else ["--extra-index-url", index.url]


def managed_env(
    base_python: Path,
    torch: str,
    index: TorchIndex,
    requirements: Iterable[str],
    settings: Settings,
) -> PythonEnv:
    """A cached venv holding torch==``torch`` and the build requirements; created with uv on first use."""
    reqs = sorted(set(requirements))
    key_text = json.dumps([str(base_python), torch, index.url, reqs])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    root = settings.cache("venvs")
    target = root / f"build-{key}"
    marker = target / ".builder-env.json"
    with FileLock(str(root / f"build-{key}.lock")):
        if marker.exists():
            marker.touch()  # last use, for `builder cache clean --older-than`
            env = probe(target / "bin" / "python", need_torch=True)
            log.info(f"build env: cached venv {target} (Python {env.version}, torch {env.torch})")
            return PythonEnv(env.python, env.version, env.torch, env.torch_cuda, env.purelib, True)
        shutil.rmtree(target, ignore_errors=True)
        if settings.offline:
            raise ToolchainError(f"no cached build venv for torch {torch} and --offline forbids installing it")
        warn_if_low_disk(root)
        try:
            with log.status(f"creating build venv {target.name}: torch=={torch} from {index.name} (first time only)"):
                run_uv(["venv", "--quiet", "--python", str(base_python), str(target)], what="venv creation")
                run_uv(
                    ["pip", "install", "--quiet", "--python", str(target / "bin" / "python"),
                     *_index_args(index), f"torch=={torch}", *reqs],
                    what=f"installing torch=={torch} into the build venv",
                )
            env = probe(target / "bin" / "python", need_torch=True)
            marker.write_text(json.dumps(env.record()))  # written last: its presence means "complete"
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    log.info(f"build env: {target} (Python {env.version}, torch {env.torch}, CUDA {env.torch_cuda})")
    return PythonEnv(env.python, env.version, env.torch, env.torch_cuda, env.purelib, True)


def missing_requirements(env: PythonEnv, requirements: Iterable[str]) -> list[str]:
    """Which of ``requirements`` are not satisfied in ``env`` (checked with packaging inside that env)."""
    reqs = list(requirements)
    if not reqs:
        return []
    code = (
        "import json,sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "from packaging.requirements import Requirement\nout=[]\n"
        "for r in json.loads(sys.argv[1]):\n"
        "    req=Requirement(r)\n"
        "    try:\n        v=version(req.name)\n    except PackageNotFoundError:\n        out.append(r); continue\n"
        "    if req.specifier and not req.specifier.contains(v, prereleases=True): out.append(r)\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([str(env.python), "-c", code, json.dumps(reqs)], capture_output=True, text=True)
    if result.returncode != 0:  # no packaging in that env: fall back to plain names via pip metadata
        return reqs
    return list(json.loads(result.stdout))


def install_into(env: PythonEnv, requirements: list[str], *, find_links: Path | None = None) -> None:
    """Install build requirements into a user-given interpreter (printed, never silent)."""
    args = ["pip", "install", "--quiet", "--python", str(env.python)]
    if find_links is not None:
        args += ["--find-links", str(find_links)]
    if not _is_venv(env.python):
        args.append("--system")
        args.append("--break-system-packages")
    log.info(f"installing missing build requirements into {env.python}: {', '.join(requirements)}")
    run_uv([*args, *requirements], what="installing build requirements")


def _is_venv(python: Path) -> bool:
    return (python.parent.parent / "pyvenv.cfg").exists()


def fresh_test_env(
    base_python: Path, torch: str, index: TorchIndex, wheel: Path, extra: Iterable[str], workdir: Path,
    *, torch_from: PythonEnv | None = None, find_links: Path | None = None,
) -> PythonEnv:
    """A clean venv holding only the wheel, its torch and ``extra``.

    With ``torch_from`` (offline, or a user's own interpreter) torch is not reinstalled: the venv sees that
    environment's site-packages through a .pth file and the wheel is installed with --no-deps.
    """
    target = workdir / "test-venv"
    shutil.rmtree(target, ignore_errors=True)
    run_uv(["venv", "--quiet", "--python", str(base_python), str(target)], what="test venv creation")
    python = target / "bin" / "python"
    if torch_from is None:
        run_uv(
            ["pip", "install", "--quiet", "--python", str(python), *_index_args(index),
             *(["--find-links", str(find_links)] if find_links and find_links.is_dir() else []), str(wheel),
             f"torch=={Version(torch).public}", *extra],
            what="installing the wheel into a clean venv",
        )
    else:
        purelib = probe(python).purelib
        (purelib / "_builder_torch_env.pth").write_text(f"{torch_from.purelib}\n")
        run_uv(["pip", "install", "--quiet", "--offline", "--no-deps", "--python", str(python), str(wheel), *extra],
               what="installing the wheel into a clean venv")
    return probe(python, need_torch=True)
