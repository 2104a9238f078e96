"""The torch-range check of the test stage: a stable-ABI wheel tried beside every torch minor it claims.

A per-torch wheel runs with the torch it was built against only, and the import test shows that. A stable-ABI wheel
(model/abi.py) claims every torch of its CUDA major from the recipe's floor on, so each of them is tried: a fresh
venv with the newest release of that torch minor (from the build's torch index, through uv's cache) and the wheel,
then the recipe's imports and, for each torch.ops namespace the recipe names, every op having a CUDA kernel. A CPU
machine can do all of that (the .so loads, its registrations run); the kernels themselves run on the GPU machine
(``builder test``, which adds a ``gpu-kernel-tests`` check for its torch). The checks go into the build record; the
index offers the wheel in the channel of each torch that passed (index/pages.py), and a torch released later is one
``builder verify`` away, not a rebuild.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.discovery.compat import TorchIndex, known_indexes
from builder.model.abi import StableAbi, torch_minor
from builder.model.cuda import CudaVersion
from builder.model.records import TorchCheck
from builder.stages.pyenv import index_args

IMPORT_REGISTRATION = "import+registration"
GPU_KERNEL_TESTS = "gpu-kernel-tests"

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


def torches_to_check(index: TorchIndex, cuda: CudaVersion, stable: StableAbi) -> list[tuple[str, str]]:
    """(torch release, CUDA line) for the newest release of every torch minor at or above the floor that ``index``
    builds for a CUDA line of ``cuda``'s major, oldest first: PyPI today gives 2.11.0, 2.12.1, 2.13.0 and 2.14.1
    (13.0) and 2.15.0 (13.2) for CUDA 13."""
    newest: dict[tuple[int, int], tuple[Version, str]] = {}
    for line, releases in index.torch_by_cuda.items():
        try:
            if CudaVersion.parse(line).major != cuda.major:
                continue
        except ValueError:
            continue  # "cpu"
        for text in releases:
            version = Version(text)
            minor = (version.major, version.minor)
            if stable.admits(text) and (minor not in newest or version > newest[minor][0]):
                newest[minor] = (version, line)
    return [(str(v), line) for _, (v, line) in sorted(newest.items())]


def other_index_torches(index: TorchIndex, cuda: CudaVersion, stable: StableAbi, have: Sequence[tuple[str, str]],
                        settings: Settings | None) -> list[tuple[TorchIndex, list[tuple[str, str]]]]:
    """The torches a stable wheel built on ``cuda`` from ``index`` claims that ``index`` does not offer: for every
    other known torch index (PyPI, PyTorch's channels), the newest release of each torch minor at or above the floor
    on a CUDA line of ``cuda``'s major not older than ``cuda``'s, whose (minor, line) ``have`` lacks. A +cu13 wheel
    built from PyPI (2.11-2.14 on 13.0, 2.15 on 13.2) is also tried with the cu130 channel's 2.15 and the cu132
    channel's 2.12-2.14: the cells ``builder coverage`` counts it for (farm/expand.py ``stable_serves``)."""
    seen = {(torch_minor(t), line) for t, line in have}
    out = []
    for other in known_indexes(settings):
        if other.url.rstrip("/") == index.url.rstrip("/"):
            continue
        found = []
        for torch, line in torches_to_check(other, cuda, stable):
            on = CudaVersion.parse(line)
            if (on.major, on.minor) >= (cuda.major, cuda.minor) and (torch_minor(torch), line) not in seen:
                seen.add((torch_minor(torch), line))
                found.append((torch, line))
        if found:
            out.append((other, found))
    return out


# (torch, folder) -> the python of a fresh env in folder holding torch and the wheel (a cross build's: under qemu)
MakeEnv = Callable[[str, Path], Path]


def venv_maker(wheel: Path, index: TorchIndex, base_python: Path) -> MakeEnv:
    """A venv of ``base_python`` on this machine with the torch and ``wheel`` installed from ``index``."""
    def make(torch: str, venv: Path) -> Path:
        run_uv(["venv", "--quiet", "--python", str(base_python), str(venv)], what="torch-range venv creation")
        python = venv / "bin" / "python"
        run_uv(["pip", "install", "--quiet", "--python", str(python), *index_args(index), f"torch=={torch}",
                str(wheel)], what=f"installing torch {torch} beside the wheel")
        return python

    return make


def check_torch_range(wheel: Path, stable: StableAbi, imports: Sequence[str], torches: Sequence[tuple[str, str]],
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
        (log.ok if check.passed else log.warning)(f"torch {torch}: {check.status}: {check.detail}")
        checks.append(check)
    return tuple(checks)


def _check_one(stable: StableAbi, imports: Sequence[str], torch: str, line: str, make: MakeEnv,
               venv: Path) -> TorchCheck:
    def failed(detail: str, python: str = "") -> TorchCheck:
        return TorchCheck(torch=torch, cuda=line, python=python, how=IMPORT_REGISTRATION, status="failed",
                          detail=detail)

    shutil.rmtree(venv, ignore_errors=True)
    try:
        python = make(torch, venv)
        result = subprocess.run([str(python), "-c", _PROBE, json.dumps(list(imports)), json.dumps(stable.namespaces)],
                                capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600)
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


def judge_probe(out: dict[str, object], torch: str, line: str, stable: StableAbi) -> TorchCheck:
    """The probe's JSON as a TorchCheck: passed when everything imported, each namespace has ops, and every op of
    them has a CUDA kernel."""
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
    else:
        detail = f"imported; {len(ops)} ops registered with CUDA kernels ({', '.join(o.split('::')[1] for o in ops)})"
    return TorchCheck(torch=torch, cuda=cuda, python=python, how=IMPORT_REGISTRATION, status=status, detail=detail)


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def describe_checks(checks: Sequence[TorchCheck]) -> str:
    passed = [c.torch for c in checks if c.passed]
    failed = [c.torch for c in checks if not c.passed]
    text = f"verified on torch {', '.join(passed) or 'none'}"
    return text + (f"; failed on {', '.join(failed)}" if failed else "")
