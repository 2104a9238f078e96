"""The torch-range check of the test stage: a wheel offered across torches tried beside every torch minor it claims.

A per-torch wheel runs with the torch it was built against only, and the import test shows that. A stable-ABI wheel
(model/abi.py) claims every torch of its CUDA major from the recipe's floor on, so each of them is tried: a fresh
venv with the newest release of that torch minor (from the build's torch index, through uv's cache) and the wheel,
then the recipe's imports and, for each torch.ops namespace the recipe names, every op having a CUDA kernel. A CPU
machine can do all of that (the .so loads, its registrations run); the kernels themselves run on the GPU machine
(``builder test``, which adds a ``gpu-kernel-tests`` check for its torch). The checks go into the build record; the
index offers the wheel in the channel of each torch that passed (index/pages.py), and a torch released later is one
``builder verify`` away, not a rebuild.

A pure-Python wheel built once (``py3-none-any``, unlabelled: recipes of kind ``pure-python``) claims a range too
(``PurePython``): every torch its own torch requirement admits (upstream's, kept as it is), on every CUDA line from
12.8 on, whatever CUDA it was built with. The same machinery tries it: a venv with that torch, the wheel (and its
companions and the recipe's test requirements), the recipe's imports; there are no ops to look at. The build's own
import test is its check for the build torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.core.cachedir import VENV_MARKER
from builder.core.errors import ToolchainError
from builder.core.log import log, plural
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.discovery.compat import TorchIndex, known_indexes
from builder.model.abi import StableAbi, torch_minor
from builder.model.cuda import CudaVersion
from builder.model.records import TorchCheck
from builder.model.wheelfacts import Wheel, torch_requirement
from builder.stages.pyenv import PythonEnv, index_args, probe, remembered_env

IMPORT_REGISTRATION = "import+registration"  # a pure-Python wheel's import check too (it registers no ops)
GPU_KERNEL_TESTS = "gpu-kernel-tests"
# A torch of the range that could not be had here without the network (--offline): neither passed nor failed. Such
# checks go into the record's ``torch_unchecked``, never its ``torch_checks`` (whose every non-passed entry keeps the
# wheel out of that torch's channel); `builder verify` checks them later.
NOT_CHECKED = "not checked"
# The oldest CUDA line a pure-Python wheel is tried on: the users' matrix starts there (Blackwell), as
# farm/coverage.py MIN_CUDA says; older lines are not the farm's users, and each line tried costs a torch download.
PURE_PYTHON_MIN_CUDA = CudaVersion.parse("12.8")


@dataclass(frozen=True)
class PurePython:
    """What a pure-Python wheel built once claims: every torch ``requirement`` admits (the wheel's own
    ``Requires-Dist: torch`` specifier, upstream's; empty: every torch), on every CUDA line from
    ``PURE_PYTHON_MIN_CUDA`` on. It has no torch.ops namespaces to look at."""

    requirement: SpecifierSet
    namespaces: tuple[str, ...] = ()

    def admits(self, torch: str) -> bool:
        return self.requirement.contains(Version(torch).public, prereleases=True)

    @classmethod
    def of_requires(cls, requires: Sequence[str]) -> PurePython:
        """From a wheel's Requires-Dist lines: its torch requirement (model/wheelfacts.py ``torch_requirement``, the
        one rule: what a CUDA user installs it with)."""
        return cls(torch_requirement(requires) or SpecifierSet())


@dataclass(frozen=True)
class PerTorch:
    """What a per-torch wheel labelled by CUDA major (``+cu12torch2.9``, model/abi.py) claims: its one torch
    ``minor`` on every CUDA line of its major not older than the one it was built on (a 12.8 build: torch 2.9 on
    cu128 and cu129). Its own build torch is checked by the import test; the others are tried like a stable
    wheel's torches (the recipe's imports; no op namespaces are looked at)."""

    minor: tuple[int, int]
    namespaces: tuple[str, ...] = ()

    def admits(self, torch: str) -> bool:
        return torch_minor(torch) == self.minor


# What a wheel offered across torches claims: a stable-ABI port's range, a pure-Python wheel's, or a per-torch wheel's
# CUDA lines
Claim = StableAbi | PurePython | PerTorch


def built_once(filename: str) -> bool:
    """Whether a wheel file, given a record, is a pure-Python wheel built once for every torch
    (model/wheelfacts.py ``Wheel.built_once``: unlabelled and ``py3-none-any``; a labelled one, ``+cu130torch2.14``,
    is per torch: it pins ``torch==``). With a record, index/channelpolicy.py ``wheel_channels`` offers it in the channel
    of each torch its checks passed on."""
    return Wheel.named(filename).with_record(abi=None, cuda=None).built_once


def _on_line(claim: Claim, line: CudaVersion, cuda: CudaVersion) -> bool:
    """Whether ``claim`` covers torches built for CUDA ``line`` (a stable or per-torch wheel built on ``cuda``: its
    major)."""
    if isinstance(claim, PurePython):
        return (line.major, line.minor) >= (PURE_PYTHON_MIN_CUDA.major, PURE_PYTHON_MIN_CUDA.minor)
    return line.major == cuda.major


# Run by the venv's interpreter: import torch and the recipe's modules, then list each namespace's ops and which
# of them lack a CUDA kernel. Prints one JSON object; an import error is reported, not raised.
_PROBE = r"""
import importlib, json, platform, sys
out = {"python": platform.python_version()}
try:
    print(json.dumps({"stage": "torch"}), flush=True)  # a crash (no JSON at the end) says where it happened
    import torch
    out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
    print(json.dumps({"stage": "wheel"}), flush=True)
    for name in json.loads(sys.argv[1]):
        importlib.import_module(name)
    namespaces = json.loads(sys.argv[2])
    ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.split("::")[0] in namespaces)
    cuda = set(torch._C._dispatch_get_registrations_for_dispatch_key("CUDA"))
    out["ops"] = ops
    out["without_cuda_kernel"] = [n for n in ops if n not in cuda]
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
print(json.dumps(out))
"""


def torches_to_check(index: TorchIndex, cuda: CudaVersion, stable: Claim) -> list[tuple[str, str]]:
    """(torch release, CUDA line) for the newest release of every torch minor at or above the floor that ``index``
    builds for a CUDA line of ``cuda``'s major, oldest first: PyPI today gives 2.11.0, 2.12.1, 2.13.0 and 2.14.1
    (13.0) and 2.15.0 (13.2) for CUDA 13. For a pure-Python wheel: every torch minor its requirement admits on
    each CUDA line from 12.8 on (the newest release of each minor per line), whatever ``cuda`` is."""
    newest: dict[tuple[int, int, str], tuple[Version, str]] = {}
    for line, releases in index.torch_by_cuda.items():
        try:
            if not _on_line(stable, CudaVersion.parse(line), cuda):
                continue
        except ValueError:
            continue  # "cpu"
        for text in releases:
            version = Version(text)
            # a stable wheel: one release per minor (an index has one CUDA line per torch); pure: per line too
            key = (version.major, version.minor, line if isinstance(stable, PurePython) else "")
            if stable.admits(text) and (key not in newest or version > newest[key][0]):
                newest[key] = (version, line)
    return [(str(v), line) for _, (v, line) in sorted(newest.items())]


def other_index_torches(index: TorchIndex, cuda: CudaVersion, stable: Claim, have: Sequence[tuple[str, str]],
                        settings: Settings | None) -> list[tuple[TorchIndex, list[tuple[str, str]]]]:
    """The torches a stable wheel built on ``cuda`` from ``index`` claims that ``index`` does not offer: for every
    other known torch index (PyPI, PyTorch's channels), the newest release of each torch minor at or above the floor
    on a CUDA line of ``cuda``'s major not older than ``cuda``'s, whose (minor, line) ``have`` lacks. A +cu13 wheel
    built from PyPI (2.11-2.14 on 13.0, 2.15 on 13.2) is also tried with the cu130 channel's 2.15 and the cu132
    channel's 2.12-2.14: the cells ``builder coverage`` counts it for (farm/served.py ``stable_serves``). A
    pure-Python wheel takes every (minor, line) from 12.8 on that ``have`` lacks, as its cells are every cell.
    None for a build from an index that is not one of those (a mirror, a local folder)."""
    known = known_indexes(settings)
    if index.url.rstrip("/") not in {k.url.rstrip("/") for k in known}:
        return []  # a build from a mirror or a local folder was pointed there on purpose: its torches only
    seen = {(torch_minor(t), line) for t, line in have}
    out = []
    for other in known:
        if other.url.rstrip("/") == index.url.rstrip("/"):
            continue
        found = []
        for torch, line in torches_to_check(other, cuda, stable):
            on = CudaVersion.parse(line)
            newer = isinstance(stable, PurePython) or (on.major, on.minor) >= (cuda.major, cuda.minor)
            if newer and (torch_minor(torch), line) not in seen:
                seen.add((torch_minor(torch), line))
                found.append((torch, line))
        if found:
            out.append((other, found))
    return out


def read_here(rounds: list[tuple[TorchIndex, list[tuple[str, str]]]]) -> list[tuple[TorchIndex, list[tuple[str, str]]]]:
    """``rounds`` less the indexes whose release list this machine never read from them (the shipped snapshot: the
    index is unreachable here, as download.pytorch.org is from some machines): their torches would only be failed
    installs, each keeping the wheel out of a channel a reachable machine can verify it for."""
    kept = []
    for index, torches in rounds:
        if torches and index.source in ("snapshot", "none"):
            log.info(f"torch range: {index.name} not tried (never read from {index.url} here: its list is the "
                     f"shipped snapshot); `builder verify` on a machine that reaches it checks "
                     f"{', '.join(t for t, _ in torches)}")
            continue
        kept.append((index, torches))
    return kept


# (torch, folder) -> the python of a fresh env in folder holding torch and the wheel (a cross build's: under qemu)
MakeEnv = Callable[[str, Path], Path]


def venv_maker(wheel: Path, index: TorchIndex, base_python: Path, *, extra: Sequence[str] = (),
               find_links: Path | None = None) -> MakeEnv:
    """A venv of ``base_python`` on this machine with the torch and ``wheel`` installed from ``index``, with
    ``extra`` (a recipe's test requirements) and wheels from ``find_links`` (companions: our fla-core for
    flash-linear-attention, as the import test has them)."""
    links = ["--find-links", str(find_links)] if find_links is not None and find_links.is_dir() else []

    def make(torch: str, venv: Path) -> Path:
        run_uv(["venv", "--quiet", "--python", str(base_python), str(venv)], what="torch-range venv creation")
        python = venv / "bin" / "python"
        run_uv(["pip", "install", "--quiet", "--python", str(python), *index_args(index), *links, f"torch=={torch}",
                str(wheel), *extra], what=f"installing torch {torch} beside the wheel")
        return python

    return make


class NotHereOffline(ToolchainError):
    """A torch of the range that this machine cannot install without the network: the check is NOT_CHECKED."""


@dataclass(frozen=True)
class TorchHere:
    """A torch already installed on this machine: the build env's own, or a cached build venv's. A check venv sees
    its site-packages (``purelib``) through a .pth file, so nothing is downloaded; only an interpreter of the same
    Python minor (``python``) can use it."""

    torch: str  # 2.11.0+cu130
    cuda: str | None  # its torch.version.cuda
    python: str  # 3.12
    purelib: Path
    where: str  # "the build env" | "cached build venv build-…"

    @classmethod
    def of(cls, env: PythonEnv, where: str) -> TorchHere | None:
        return cls(env.torch, env.torch_cuda, env.version, env.purelib, where) if env.torch else None


def cached_torches(venvs: Path, python: str) -> list[TorchHere]:
    """The torches of the complete build venvs cached under ``venvs`` whose Python is ``python`` (from their
    markers: no interpreter is started unless torch changed since)."""
    found = []
    for marker in sorted(venvs.glob(f"build-*/{VENV_MARKER}")):
        try:
            env = remembered_env(marker, marker.parent / "bin" / "python")
        except OSError:
            env = None
        here = TorchHere.of(env, f"cached build venv {marker.parent.name}") if env is not None else None
        if here is not None and here.python == python:
            found.append(here)
    return found


def offline_maker(wheel: Path, index: TorchIndex, base_python: Path, here: Sequence[TorchHere], *,
                  extra: Sequence[str] = (), find_links: Path | None = None) -> MakeEnv:
    """``--offline``: a check venv for a torch without the network. A torch of ``here`` (the build env's, cached
    build venvs') is borrowed through a .pth file and the wheel installed beside it with ``--no-deps``; any other
    comes from uv's cache (``uv pip install --offline``). What neither has raises NotHereOffline."""
    links = ["--find-links", str(find_links)] if find_links is not None and find_links.is_dir() else []

    def make(torch: str, venv: Path) -> Path:
        run_uv(["venv", "--quiet", "--python", str(base_python), str(venv)], what="torch-range venv creation")
        python = venv / "bin" / "python"
        have = next((h for h in here if Version(h.torch).public == Version(torch).public), None)
        try:
            if have is not None:
                log.info(f"torch range: torch {torch} from {have.where} ({have.purelib}), no download")
                (probe(python, with_torch=False).purelib / "_builder_torch_env.pth").write_text(f"{have.purelib}\n")
                run_uv(["pip", "install", "--quiet", "--offline", "--no-deps", "--python", str(python), *links,
                        str(wheel), *extra], what=f"installing the wheel beside torch {torch}")
            else:
                run_uv(["pip", "install", "--quiet", "--offline", "--python", str(python), *index_args(index), *links,
                        f"torch=={torch}", str(wheel), *extra], what=f"installing torch {torch} from uv's cache")
        except ToolchainError as e:
            cause = e.message.rsplit(" | ", 1)[-1].split(" failed: ", 1)[-1]  # uv says the root cause last
            cause = cause if len(cause) <= 200 else "…" + cause[-200:]
            raise NotHereOffline(f"offline: torch {torch} is not on this machine without the network (uv "
                                 f"--offline: {cause})") from e
        return python

    return make


def check_torch_range(wheel: Path, stable: Claim, imports: Sequence[str], torches: Sequence[tuple[str, str]],
                      index: TorchIndex, base_python: Path, workdir: Path, *,
                      make_env: MakeEnv | None = None) -> tuple[TorchCheck, ...]:
    """Each of ``torches`` tried with the wheel in a fresh env (removed afterwards; ``make_env`` makes it, default a
    venv of ``base_python``); one TorchCheck each. A torch that cannot be installed is a failed check with uv's
    reason, not an error: the others still say something."""
    make = make_env or venv_maker(wheel, index, base_python)
    checks = []
    for torch, line in torches:
        log.info(f"torch range: {wheel.name} beside torch {torch} (CUDA {line})")
        check = _check_one(stable, imports, torch, line, make, workdir / "torch-range" / torch)
        (log.ok if check.passed else log.info if check.status == NOT_CHECKED else log.warning)(
            f"torch {torch}: {check.status}: {check.detail}")
        checks.append(check)
    return tuple(checks)


def _check_one(stable: Claim, imports: Sequence[str], torch: str, line: str, make: MakeEnv,
               venv: Path) -> TorchCheck:
    def failed(detail: str, python: str = "") -> TorchCheck:
        return TorchCheck(torch=torch, cuda=line, python=python, how=IMPORT_REGISTRATION, status="failed",
                          detail=detail)

    shutil.rmtree(venv, ignore_errors=True)
    try:
        python = make(torch, venv)
        result = subprocess.run([str(python), "-c", _PROBE, json.dumps(list(imports)), json.dumps(stable.namespaces)],
                                capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600)
    except NotHereOffline as e:
        return TorchCheck(torch=torch, cuda=line, python="", how=IMPORT_REGISTRATION, status=NOT_CHECKED,
                          detail=e.message)
    except ToolchainError as e:
        return failed(e.message)
    except subprocess.TimeoutExpired:
        return failed("the import probe ran past 600 s")
    finally:
        shutil.rmtree(venv, ignore_errors=True)
    try:
        out = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = {}
    if "stage" in out or not out:  # it died before printing its answer
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        if out.get("stage") == "torch":
            return failed(f"torch {torch} itself crashed on import, before the wheel was loaded (exit "
                          f"{result.returncode}: {last}): the wheel could not be tried with it here")
        return failed(f"the import probe crashed (exit {result.returncode}): {last}")
    return judge_probe(out, torch, line, stable)


def judge_probe(out: dict[str, object], torch: str, line: str, stable: Claim) -> TorchCheck:
    """The probe's JSON as a TorchCheck: passed when everything imported, each namespace has ops, and every op of
    them has a CUDA kernel (a pure-Python wheel: when everything imported)."""
    python, cuda = str(out.get("python", "")), str(out.get("cuda") or line)
    status, detail = "passed", ""
    ops, missing = _strings(out.get("ops")), _strings(out.get("without_cuda_kernel"))
    empty = [ns for ns in stable.namespaces if not any(o.split("::")[0] == ns for o in ops)]
    if "error" in out:
        status, detail = "failed", f"import failed: {out['error']}"
    elif "cuda" in out and out["cuda"] is None:
        status, detail = "failed", f"torch {out.get('torch', torch)} there is a CPU build (no CUDA torch for this platform)"
    elif empty:
        status, detail = "failed", f"no ops registered in namespace {', '.join(empty)}"
    elif missing:
        status, detail = "failed", f"no CUDA kernel for {', '.join(missing)}"
    elif not stable.namespaces:
        detail = "imported (pure Python: no ops to register)"
    else:
        detail = f"imported; {plural(len(ops), 'op')} registered with CUDA kernels ({', '.join(o.split('::')[1] for o in ops)})"
    return TorchCheck(torch=torch, cuda=cuda, python=python, how=IMPORT_REGISTRATION, status=status, detail=detail)


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def torch_names(checks: Sequence[TorchCheck]) -> str:
    """The torches of ``checks`` with their CUDA (``2.15.0+cu130, 2.15.0+cu132``), each once, in order: the same
    release on two CUDA lines is two torches, and one tried twice (two GPUs) is one."""
    return ", ".join(dict.fromkeys(c.named for c in checks))


def describe_checks(checks: Sequence[TorchCheck]) -> str:
    passed = torch_names([c for c in checks if c.passed])
    failed = torch_names([c for c in checks if not c.passed and c.status != NOT_CHECKED])
    unchecked = torch_names([c for c in checks if c.status == NOT_CHECKED])
    text = f"verified on torch {passed or 'none'}"
    return text + (f"; failed on {failed}" if failed else "") + (f"; not checked on {unchecked}" if unchecked else "")


def split_unchecked(checks: Sequence[TorchCheck]) -> tuple[tuple[TorchCheck, ...], tuple[TorchCheck, ...]]:
    """(the checks made, the torches NOT_CHECKED): the record keeps them apart (``torch_checks`` decides channels)."""
    return (tuple(c for c in checks if c.status != NOT_CHECKED), tuple(c for c in checks if c.status == NOT_CHECKED))
