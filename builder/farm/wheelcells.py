"""What one wheel of the wheelhouse serves of the users' matrix, and with which evidence (farm/coverage.py's
statuses): the cells its tags and label name, each kernel-tested, import-verified or only built, read from its
record's test reports and torch checks; the archs it ships and the arch of the GPU its kernels ran on.

Evidence counts for the cell it ran on: the Python of the venv the check or test ran in and the platform it ran
for. A cell the same evidence reaches only by a rule (a ``cp310-abi3`` wheel checked on Python 3.12 is the same
file on 3.13; a ``py3-none-any`` wheel checked on x86_64 is the same file on aarch64) is ``inferred``, shown apart
and never counted as served."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.farm.served import Cell, on_major
from builder.model.abi import torch_minor
from builder.model.cuda import CudaVersion
from builder.model.platform import of_wheel_platform
from builder.model.records import BuildRecord, TestReport
from builder.model.wheelfacts import Wheel

KERNEL = "kernel-tested"
IMPORT = "import-verified"
INFERRED = "inferred"
BUILT = "built"
ABI3_PYTHON = "3.10"


def _pythons_of_tags(filename: str) -> tuple[set[str] | None, bool]:
    """(the Pythons a wheel's tags name, None for every Python; whether it is abi3)."""
    _, _, _, tags = parse_wheel_filename(filename)
    pythons: set[str] = set()
    abi3 = False
    for tag in tags:
        if tag.abi == "abi3":
            abi3 = True
        if tag.abi.endswith("t") and tag.abi.startswith("cp"):
            continue  # free-threaded
        match = re.fullmatch(r"cp3(\d+)", tag.interpreter)
        if match:
            pythons.add(f"3.{match.group(1)}")
        elif tag.interpreter in ("py3", "py2.py3"):
            return None, abi3
    return pythons, abi3


def wheel_platforms(filename: str) -> set[str] | None:
    """The platforms a wheel's tags name (``manylinux_2_28_aarch64`` → aarch64); None for ``any`` (every platform);
    an empty set for a platform the users' matrix does not have (win_amd64, macOS)."""
    _, _, _, tags = parse_wheel_filename(filename)
    found: set[str] = set()
    for tag in tags:
        if tag.platform == "any":
            return None
        platform = of_wheel_platform(tag.platform) if "linux" in tag.platform else None
        if platform is not None:
            found.add(platform.name)
    return found


UNKNOWN_ARCH = "unknown arch"
# GPUs whose name says their arch, for records from before the test report kept the GPU's capability; a name that
# matches none of these, or several, is "unknown arch"
_GPU_ARCHS: tuple[tuple[str, int], ...] = (
    (r"\b(GH200|H100|H200|H800|H20)\b", 90), (r"\bG?B200\b", 100), (r"\bG?B300\b", 103), (r"\bThor\b", 110),
    (r"\bRTX (50[5-9]0|PRO \d000 Blackwell)", 120), (r"\bGB10\b|DGX Spark", 121))


def tested_arch(tests: TestReport | None) -> int | None:
    """The arch of the GPU a record's kernel tests passed on: its compute capability (9.0 → 90), else the GPU's name
    where it maps to exactly one arch; None where none passed or the arch is unknown."""
    if tests is None or tests.kernel_status != "passed":
        return None
    if tests.capability is not None:
        return tests.capability.number
    found = {arch for pattern, arch in _GPU_ARCHS if tests.gpu and re.search(pattern, tests.gpu)}
    return found.pop() if len(found) == 1 else None


def arch_number(name: str) -> int:
    digits = re.search(r"\d+", name)
    return int(digits.group()) if digits else 0


def wheel_archs(record: BuildRecord | None) -> tuple[str, ...]:
    """The archs a wheel ships, as "sm_90", from its record's arch list ("100+ptx" → "sm_100")."""
    return tuple(dict.fromkeys(f"sm_{arch_number(a)}" for a in (record.archs if record else ())))


def tested_arch_name(record: BuildRecord | None) -> str:
    """``sm_90,sm_120``: the arch of each GPU report whose kernel tests passed (one per arch the record keeps)."""
    reports = (record.gpu_reports or (record.tests,)) if record and record.tests else ()
    archs = dict.fromkeys(f"sm_{arch}" for r in reports if (arch := tested_arch(r)) is not None)
    return ",".join(archs) or UNKNOWN_ARCH


def _kernel_text(record: BuildRecord, gpu: str | None = None) -> str:
    """``kernel-tested on sm_90 (GPU NVIDIA H100 …); sm_120 kernel-untested``: the arch its kernels ran on, not
    every arch the wheel ships."""
    gpus = dict.fromkeys(r.gpu for r in record.gpu_reports if r.gpu and r.kernel_status == "passed")
    where = gpu or ", ".join(gpus) or (record.tests.gpu if record.tests else None) or "?"
    archs = wheel_archs(record)
    arch = tested_arch_name(record)
    if arch == UNKNOWN_ARCH:
        return f"kernel-tested on GPU {where} ({UNKNOWN_ARCH}; ships {','.join(archs)})" if archs else (
            f"kernel-tested on GPU {where}")
    rest = [a for a in archs if a not in arch.split(",")]
    return f"kernel-tested on {arch} (GPU {where})" + (f"; {','.join(rest)} kernel-untested" if rest else "")


def _tested_on(torch_text: str | None) -> tuple[str, str | None] | None:
    """``2.11.0+cu130`` → ("2.11", "13.0")."""
    if not torch_text:
        return None
    try:
        v = Version(torch_text)
    except InvalidVersion:
        return None
    line = CudaVersion.from_flavour(v.local or "")
    return f"{v.major}.{v.minor}", line.line if line is not None else None


def wheel_cells(filename: str, record: BuildRecord | None, matrix: frozenset[Cell],
                floor: str | None) -> dict[Cell, tuple[str, str]]:
    """The cells of ``matrix`` this wheel is for, each with (status, evidence)."""
    wheel = Wheel.of(filename, record)
    pythons, abi3 = _pythons_of_tags(filename)
    platforms = wheel_platforms(filename)
    if platforms is not None:
        matrix = frozenset(c for c in matrix if c.platform in platforms)
    label = wheel.label
    if wheel.stable:
        return _stable_cells(record, label.cuda_major if label else None, matrix, floor, filename)
    if wheel.local is None and pythons is None and platforms is None:  # py3-none-any, built once: its checks decide
        return _checked_cells(record, matrix, lambda cell: True, filename)
    if wheel.per_torch_major and label is not None and label.torch is not None:
        # cu12torch2.9: its torch minor on the lines of its CUDA major, as its checks say
        per_torch = (label.cuda_major, label.torch)
        return _checked_cells(record, matrix, lambda c: _per_torch_claims(c, per_torch, record, pythons, abi3),
                              filename)
    label_line = label.cuda_line if wheel.per_torch_line and label is not None else None
    torch_minor_text = label.torch_text if label is not None else None
    if label_line is None or torch_minor_text is None:  # a label of no shape the builder writes
        return {}
    line = (record.cuda_version.line if record and record.cuda_version else None) or label_line.line
    tests = record.tests if record else None
    ran = Ran(_tests_python(record, filename), _checks_platform(filename, record))
    if tests and tests.kernel_status == "passed" and record is not None:
        outcome = (KERNEL, _kernel_text(record))
    elif tests and tests.import_status == "passed":
        outcome = (IMPORT, f"import-verified on its torch ({tests.torch or torch_minor_text})")
    else:
        outcome = (BUILT, "built, not verified")
    return {c: ran.judge(c, *outcome) for c in matrix
            if c.torch == torch_minor_text and c.cuda == line and _python_fits(c.python, pythons, abi3)}


def _per_torch_claims(cell: Cell, label: tuple[int, tuple[int, int]], record: BuildRecord | None,
                      pythons: set[str] | None, abi3: bool) -> bool:
    """Whether a per-torch wheel labelled by CUDA major (``label``: (12, (2, 9))) claims ``cell``: its torch minor, a
    line of its major not older than the one it was built on (its record's), a Python its tags take."""
    major, minor = label
    return (_on_major(cell, major, record) and torch_minor(cell.torch) == minor
            and _python_fits(cell.python, pythons, abi3))


def _on_major(cell: Cell, major: int, record: BuildRecord | None) -> bool:
    """Whether a wheel labelled by CUDA ``major`` is for ``cell``'s CUDA: a line of that major, not older than the one
    its record says it was built on (farm/served.py ``on_major``; any line of the major without a record)."""
    built = record.cuda_version if record else None
    return on_major(built, cell) if built is not None else CudaVersion.parse(cell.cuda).major == major


def _python_fits(python: str, pythons: set[str] | None, abi3: bool) -> bool:
    """Whether a wheel whose tags name ``pythons`` (None: py3, every Python) is for ``python``: a ``cp310-abi3``
    wheel (a per-torch one whose recipe has ``[per-torch-abi3]``) is for every CPython from 3.10 up, a ``cp312``
    one for 3.12 alone."""
    if pythons is None:
        return True
    if abi3 and pythons:
        return Version(python) >= min(map(Version, pythons))
    return python in pythons


def _stable_cells(record: BuildRecord | None, major: int | None, matrix: frozenset[Cell],
                  floor: str | None, filename: str) -> dict[Cell, tuple[str, str]]:
    built = record.cuda_version if record else None
    major = major if major is not None else built.major if built else None
    if major is None:
        return {}
    floor_minor = torch_minor(record.torch_floor) if record and record.torch_floor else (
        torch_minor(floor) if floor else (0, 0))

    def claims(c: Cell) -> bool:
        return (_on_major(c, major, record) and torch_minor(c.torch) >= floor_minor
                and Version(c.python) >= Version(ABI3_PYTHON))

    return _checked_cells(record, matrix, claims, filename)


def _checked_cells(record: BuildRecord | None, matrix: frozenset[Cell],
                   claims: Callable[[Cell], bool], filename: str) -> dict[Cell, tuple[str, str]]:
    """A wheel offered by its torch checks (stable-ABI, per-torch by CUDA major, pure Python built once): each cell it
    ``claims``, with the
    evidence of its record's torch checks on that torch minor and CUDA line (a failed one keeps it unverified)."""
    out: dict[Cell, tuple[str, str]] = {}
    checks = (record.torch_checks or ()) if record else ()
    tested = _tested_on(record.tests.torch) if record and record.tests else None
    platform = _checks_platform(filename, record)
    for c in matrix:
        if not claims(c):
            continue
        here = [k for k in checks if _tested_on(k.torch) is not None and torch_minor(k.torch) == torch_minor(c.torch)
                and k.cuda == c.cuda]
        failed = [k for k in here if not k.passed]
        if failed:
            out[c] = (BUILT, f"built, not verified: {failed[0].how} failed on torch {failed[0].torch}")
            continue
        found: list[tuple[str, str, Ran]] = []  # each piece of evidence for the cell's torch and CUDA, where it ran
        for k in here:
            if record is not None and k.how == "gpu-kernel-tests":
                found.append((KERNEL, _kernel_text(record) + f" with torch {k.torch}", Ran(_minor(k.python), platform)))
            elif k.how == "import+registration":
                found.append((IMPORT, f"import-verified on torch {k.torch} (cu{c.cuda})", Ran(_minor(k.python), platform)))
        if record is not None and record.tests and record.tests.kernel_status == "passed" and tested == (
                c.torch, c.cuda):
            found.append((KERNEL, _kernel_text(record) + f" with torch {record.tests.torch}",
                          Ran(_tests_python(record, filename), platform)))
        out[c] = _best(c, found)
    return out


_RANK = {KERNEL: 4, IMPORT: 3, INFERRED: 2, BUILT: 1}


def rank(status: str) -> int:
    """kernel-tested > import-verified > inferred > built (farm/coverage.py keeps each cell's best)."""
    return _RANK.get(status, 0)


def _best(cell: Cell, found: list[tuple[str, str, Ran]]) -> tuple[str, str]:
    """The strongest evidence that ran on ``cell``'s Python and platform, else the strongest inferred from another."""
    judged = [ran.judge(cell, status, text) for status, text, ran in found]
    return max(judged, key=lambda outcome: rank(outcome[0]), default=(BUILT, "built, not verified on this torch"))


@dataclass(frozen=True)
class Ran:
    """Where a check or test ran: the Python minor of its venv ("3.12"; None where the record does not say) and the
    platform it ran for."""

    python: str | None
    platform: str

    def judge(self, cell: Cell, status: str, evidence: str) -> tuple[str, str]:
        """(status, evidence) of this evidence for ``cell``: as it is where it ran on the cell's Python and platform;
        ``inferred`` elsewhere (kernel-tested or import-verified only)."""
        if status not in (KERNEL, IMPORT) or (self.python == cell.python and self.platform == cell.platform):
            return status, evidence
        where = f"Python {self.python or '?'} {self.platform}"
        return INFERRED, f"inferred (same file; {status} on {where}): {evidence}"


def _minor(python: str | None) -> str | None:
    """``3.12.1`` → ``3.12``; None stays None."""
    try:
        return "{}.{}".format(*Version(python).release[:2]) if python else None
    except (InvalidVersion, TypeError):
        return None


def _tests_python(record: BuildRecord | None, filename: str) -> str | None:
    """The Python minor a record's tests ran on: the one Python a ``cp312-cp312`` wheel installs on; else the
    report's own; else (a record from before reports named it) the Python the wheel was built with, which
    ``builder build`` tests on."""
    pythons, abi3 = _pythons_of_tags(filename)
    if pythons is not None and len(pythons) == 1 and not abi3:
        return next(iter(pythons))
    if record is None:
        return None
    found = record.tests.python if record.tests else None
    return _minor(found or record.build_python)


def _checks_platform(filename: str, record: BuildRecord | None) -> str:
    """The platform a wheel's checks ran for: its platform tag's, else (``any``) the machine it was built on."""
    platforms = wheel_platforms(filename)
    if platforms:
        return sorted(platforms)[0]
    machine = str((record.host or {}).get("machine", "")) if record else ""
    return {"arm64": "aarch64"}.get(machine, machine) or "x86_64"
