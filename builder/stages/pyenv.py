"""The Python side of a build: the build venv with the pinned torch, or what the toolchain brings instead.

For the pip and host toolchains a managed build venv is created with uv on this machine once per (interpreter,
torch, index, build requirements) and reused. The docker toolchain brings its own (``BuildHost.prepare_python``):
the image's CPython, and the pinned torch that cibuildwheel installs from a prefetched cache when it builds; no
venv is made. ``--python PATH`` builds against an existing interpreter and the torch already installed there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder.core.cachedir import VENV_MARKER, entry_lock, memo_dir
from builder.core.errors import ToolchainError
from builder.core.filememo import file_stamp
from builder.core.fsutil import atomic_write
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.smallrun import run_small
from builder.core.statefile import read_json_or_none
from builder.core.uvtool import install_failure, run_uv, warn_if_low_disk
from builder.discovery.compat import TorchIndex
from builder.discovery.torchindex import PYTORCH_CHANNELS
from builder.model import variants
from builder.stages.plan import Plan
from builder.toolchain.base import (
    NO_MOUNTS,
    PROBE_OUTPUT_LIMIT,
    PYTHON_PROBE,
    BuildHost,
    Mounts,
    PreparedPython,
    probe_answer,
    tail,
)
from builder.toolchain.local import LOCAL, LocalRunner, find_interpreter

__all__ = ["PythonEnv", "find_interpreter", "fresh_test_env", "managed_env", "probe", "python_for"]

BUILD_REQUIREMENTS = ("build", "setuptools>=64", "wheel", "packaging")


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
    prepared: PreparedPython | None = None  # what a host that brings its own Python answered (WheelRequest.prepared)

    def record(self) -> dict[str, str | None]:
        return {"python": str(self.python), "version": self.version, "torch": self.torch, "torch_cuda": self.torch_cuda}


def probe(python: Path, *, need_torch: bool = False, with_torch: bool = True, host: BuildHost = LOCAL,
          mounts: Mounts = NO_MOUNTS) -> PythonEnv:
    """Ask an interpreter (run by ``host``) for its version and torch (import torch can take a few seconds). Its
    answer is not trusted: on this machine what it prints is bounded (core/smallrun.py), and the answer's JSON
    shape is checked (``probe_answer``), so a wrong interpreter is one line, never a traceback."""
    argv = [str(python), "-c", PYTHON_PROBE] + ([] if with_torch or need_torch else ["--no-torch"])
    try:
        if isinstance(host, LocalRunner):
            ran = run_small(argv, limit=PROBE_OUTPUT_LIMIT, timeout_s=300)
            if ran.overflowed:
                raise ToolchainError(f"--python {python}: printed more than {PROBE_OUTPUT_LIMIT} bytes answering the "
                                     "environment probe; stopped",
                                     "give a working Python interpreter (VENV/bin/python, or a venv folder)")
            if ran.timed_out:
                raise ToolchainError(f"--python {python}: did not answer the environment probe within 300 s",
                                     "check that `import torch` works there")
            code, output = ran.code, ran.output
        else:
            result = host.run(argv, mounts=mounts, network=False, timeout_s=300)
            code, output = result.code, result.output
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"--python {python}: cannot run it: {e}") from e
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if code != 0:
        raise ToolchainError(f"--python {python}: it fails to start (exit {code}): {tail(output)}")
    info = probe_answer(lines[-1] if lines else "", python, output)
    if need_torch and not info["torch"]:
        raise ToolchainError(
            f"--python {python}: torch is not importable there ({info.get('torch_error') or 'not installed'})",
            "install the torch you want the wheel built against into that environment",
        )
    return PythonEnv(python, info["version"], info["torch"], info["torch_cuda"], Path(info["purelib"]), False,
                     Path(info["executable"]))


def python_for(plan: Plan, settings: Settings, host: BuildHost = LOCAL) -> tuple[PythonEnv, Path]:
    """The build's Python (a managed venv made by ``host``, or the user's ``--python PATH``) and the interpreter
    on this machine that the import and kernel tests start from (they always run here)."""
    requirements = [*BUILD_REQUIREMENTS, *plan.recipe.build_requires]
    if plan.target.python.is_path:
        given = host.given_python(Path(plan.target.python.text))
        return _given_env(plan, given, requirements, offline=settings.offline), given
    assert plan.torch is not None
    brought = host.prepare_python(str(plan.target.python), plan.torch, plan.index.url, sorted(set(requirements)))
    if brought is not None:
        log.info(f"build env{host.where}: {brought.python} (Python {brought.version}, torch {brought.torch}, "
                 f"CUDA {brought.torch_cuda}), installed by the build itself")
        env = PythonEnv(brought.python, brought.version, brought.torch, brought.torch_cuda, brought.purelib, True,
                        prepared=brought)
        check_torch_cuda(plan, env)
        return env, find_interpreter(env.version, memo=memo_dir(settings))
    base = find_interpreter(str(plan.target.python), memo=memo_dir(settings))
    env = managed_env(str(base), plan.torch, plan.index, requirements, settings)
    check_torch_cuda(plan, env)
    return env, find_interpreter(env.version, memo=memo_dir(settings))


def check_torch_cuda(plan: Plan, env: PythonEnv) -> None:
    """Stop before compiling when the build venv's torch was not built with the plan's CUDA line (torch.version.cuda,
    as the probe read it): another CUDA, or None (a CPU torch). The index may not have said which CUDA it serves
    (``plan.torch_cuda_unverified``), or may serve another torch than it lists; the wheel's label must not lie."""
    if not plan.recipe.kind.is_cuda:
        return
    line = ".".join(env.torch_cuda.split(".")[:2]) if env.torch_cuda else None
    if line == plan.cuda.line:
        return
    what = f"a CUDA {line} build" if line else "a CPU build (torch.version.cuda is None)"
    cure = (f"use --cuda {line}, or a --torch/--torch-index whose torch is a CUDA {plan.cuda} build" if line else
            f"pass --torch-index with an index serving a CUDA {plan.cuda} torch"
            + (f", e.g. --torch-index {plan.cuda.flavour}" if plan.cuda.flavour in PYTORCH_CHANNELS else ""))
    told = ", which the index did not say" if plan.torch_cuda_unverified else ""
    raise ToolchainError(f"the build venv's torch {env.torch} from {plan.index.name} is {what}, not CUDA {plan.cuda} "
                         f"as planned{told}: stopped before compiling", cure)


def _given_env(plan: Plan, python: Path, requirements: list[str], *, offline: bool) -> PythonEnv:
    """``--python PATH`` as the build's Python, its missing build requirements installed (never ``offline``: an
    offline resolution has no side effects, and the farm's up-front check is one)."""
    env = probe(python, need_torch=True)
    if env.torch_cuda and plan.recipe.kind.is_cuda:
        cuda = plan.cuda
        if ".".join(env.torch_cuda.split(".")[:2]) != cuda.line:
            raise ToolchainError(
                f"--python {plan.target.python}: its torch {env.torch} is a CUDA {env.torch_cuda} build, "
                f"not CUDA {cuda}", f"use --cuda {env.torch_cuda} or an interpreter whose torch matches",
            )
    missing = missing_requirements(env, requirements)
    if missing and offline:
        names = list(dict.fromkeys(missing))
        install = shlex.join(["uv", "pip", "install", "--python", str(env.python), *names])
        raise ToolchainError(f"--python {plan.target.python}: the build requirements {', '.join(names)} are not "
                             "installed there and --offline forbids installing them",
                             f"install them first ({install}) or build without --offline")
    if missing:
        find_links = os.environ.get("BUILDER_FIND_LINKS")
        install_into(env, missing, find_links=Path(find_links) if find_links else None)
    log.info(f"python: {env.python} (Python {env.version}, torch {env.torch}, CUDA {env.torch_cuda})")
    return env


def index_args(index: TorchIndex) -> list[str]:
    # uv gives --extra-index-url priority over the default index, so torch comes from the torch index.
    return [] if index.name == "pypi" else ["--extra-index-url", index.url]


def managed_env(
    base_python: str,
    torch: str,
    index: TorchIndex,
    requirements: Iterable[str],
    settings: Settings,
) -> PythonEnv:
    """A cached venv on this machine holding torch==``torch`` and the build requirements; created with uv on
    first use from the interpreter ``base_python``."""
    reqs = sorted(set(requirements))
    key_text = json.dumps([base_python, torch, index.url, reqs])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    root = settings.cache("venvs")
    target = root / f"build-{key}"
    marker = target / VENV_MARKER
    python = target / "bin" / "python"
    with entry_lock(target):
        if marker.exists():
            env = reuse_env(marker, python)
            log.info(f"build env: cached venv {target} (Python {env.version}, torch {env.torch})")
            return PythonEnv(env.python, env.version, env.torch, env.torch_cuda, env.purelib, True)
        shutil.rmtree(target, ignore_errors=True)
        if settings.offline:
            raise ToolchainError(f"no cached build venv for torch {torch} and --offline forbids installing it")
        warn_if_low_disk(root)
        try:
            with log.status(f"creating build venv {target.name}: torch=={torch} from {index.name} "
                            "(first time only)"):
                _uv(["venv", "--quiet", "--python", base_python, str(target)], target, what="venv creation")
                _uv(["pip", "install", "--quiet", "--python", str(python), *index_args(index),
                     f"torch=={torch}", *reqs], target, what=f"installing torch=={torch} into the build venv")
            env = probe(python, need_torch=True)
            remember_env(marker, env)  # written last: its presence means "complete"
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    log.info(f"build env: {target} (Python {env.version}, torch {env.torch}, CUDA {env.torch_cuda})")
    return PythonEnv(env.python, env.version, env.torch, env.torch_cuda, env.purelib, True)


def _torch_stamp(python: Path, purelib: Path) -> list[object]:
    """What changes when the venv's interpreter or torch does: the interpreter's file, torch's dist-info folders
    (a reinstall makes new ones) and torch/version.py (where ``__version__`` and ``version.cuda`` come from)."""
    files = [file_stamp(python), file_stamp(purelib / "torch" / "version.py")]
    return [*files, *([d.name, *file_stamp(d)[1:]] for d in sorted(purelib.glob("torch-*.dist-info")))]


def remember_env(marker: Path, env: PythonEnv) -> None:
    """Write the venv's identity (what ``probe`` said, and ``_torch_stamp``) into its marker, atomically: the
    marker's presence still means "complete"."""
    data: dict[str, object] = dict(env.record())
    try:
        data.update(purelib=str(env.purelib), executable=str(env.executable or ""),
                    stamp=_torch_stamp(env.python, env.purelib))
    except OSError:
        pass  # no torch/version.py: nothing to key on, so the next use probes again
    if marker.is_dir() and not marker.is_symlink():  # a damaged marker: a folder in its place
        shutil.rmtree(marker)
    atomic_write(marker, json.dumps(data))


def reuse_env(marker: Path, python: Path) -> PythonEnv:
    """A complete build venv's identity: from its marker when torch and the interpreter are as they were, else
    probed (torch imported) and written back. Touching or rewriting the marker marks the last use, for
    `builder cache clean --older-than`."""
    env = remembered_env(marker, python)
    if env is not None:
        marker.touch()
        return env
    env = probe(python, need_torch=True)
    remember_env(marker, env)
    return env


def remembered_env(marker: Path, python: Path) -> PythonEnv | None:
    """The venv's identity from its marker, without starting its interpreter; None (probe it) when the marker
    predates this, names another interpreter, or torch or the interpreter changed since it was written."""
    data = read_json_or_none(marker)  # damaged (not JSON, a fifo, a folder): probed again and written over
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("python", "version", "purelib")) \
            or not all(isinstance(data.get(k), str | None) for k in ("torch", "torch_cuda", "executable")):
        return None
    try:
        purelib, stamp = Path(data["purelib"]), data["stamp"]
        if data["python"] != str(python) or stamp != json.loads(json.dumps(_torch_stamp(python, purelib))):
            return None
        executable = Path(data["executable"]) if data["executable"] else None
        return PythonEnv(python, data["version"], data["torch"], data["torch_cuda"], purelib, False, executable)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _uv(args: Sequence[str], where: Path, *, what: str) -> None:
    """``uv ARGS`` on this machine; a failure is a ToolchainError naming ``what`` with uv's last lines."""
    argv = [LOCAL.uv, *args]
    log.command(argv)
    env = dict(os.environ)
    env.setdefault("UV_NO_PROGRESS", "1")
    try:
        result = LOCAL.run(argv, env=env, network=True)
    except FileNotFoundError as e:
        raise ToolchainError("uv is not installed", "pip install uv (it is a dependency of this tool)") from e
    if result.code != 0:
        raise install_failure(what, result.output, where=where)


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
    variant = variants.of_wheel(wheel)  # a variant installs only with uv's preview flag, told the GPU it is for
    flags, env = variant.forced_install(os.environ) if variant else ([], None)
    if torch_from is None:
        run_uv(
            ["pip", "install", "--quiet", *flags, "--python", str(python), *index_args(index),
             *(["--find-links", str(find_links)] if find_links and find_links.is_dir() else []), str(wheel),
             f"torch=={Version(torch).public}", *extra],
            what="installing the wheel into a clean venv", env=env,
        )
    else:
        purelib = probe(python).purelib
        (purelib / "_builder_torch_env.pth").write_text(f"{torch_from.purelib}\n")
        run_uv(["pip", "install", "--quiet", *flags, "--offline", "--no-deps", "--python", str(python), str(wheel),
                *extra], what="installing the wheel into a clean venv", env=env)
    return probe(python, need_torch=True)
