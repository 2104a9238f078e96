"""The one rule for merging what two machines learnt about the same wheel file: their build records.

A wheel is tested by several machines (the nightly's sm_90 and sm_120 GPU jobs, an H100 and an H200 of one arch,
a later run with a newer torch); each writes the wheel's record with its own results. Merged:

- **test reports** (``gpu_tests``) are keyed by ``report_key``: (GPU arch, GPU model, torch). A later report
  replaces only the one with its key; every other is kept. ``BuildRecord.with_tests`` adds one report by this rule.
- **torch checks** (``torch_checks``) are keyed by ``check_key``: (torch release, CUDA line, how, GPU), the GPU
  only for a ``gpu-kernel-tests`` check (an import check ran on no GPU). A later check replaces the one with its
  key, in its place at the end; ``builder test`` (a GPU's check) and ``builder verify`` (import checks) add
  theirs by this rule.
- **torches not checked** (``torch_unchecked``) are kept unless a merged check now covers that torch and CUDA line.
- everything else is the later record's (``tests``, the latest report, is the later one's where it has one).

Records of two different wheels are never merged: ``merge_records`` refuses (``RecordMergeError``) records whose
``wheel_sha256`` or ``wheel`` differ. The types are read by attribute only, so model/records.py can use the keys
without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from builder.core.errors import PublishError

if TYPE_CHECKING:
    from builder.model.records import BuildRecord, TestReport, TorchCheck

GPU_KERNEL_TESTS = "gpu-kernel-tests"  # stages/torchrange.py's name for a check by the kernel suite on a GPU

ReportKey = tuple[int, str, str, str]
CheckKey = tuple[Version, str, str, str]


class RecordMergeError(PublishError):
    """Two records (or wheels) that are not of the same wheel file, asked to be merged."""


def report_key(report: TestReport) -> ReportKey:
    """What one test report is of: (GPU arch as its number and suffix, GPU model, torch as it was installed:
    ``2.14.1+cu130``). A report with no arch (no GPU ran) keys as arch 0."""
    arch = report.capability
    return (arch.number if arch is not None else 0, arch.suffix if arch is not None else "",
            (report.gpu or "").strip(), (report.torch or "").strip())


def check_gpu(check: TorchCheck) -> str:
    """The GPU a ``gpu-kernel-tests`` check ran on, as its detail names it (``3 passed on NVIDIA H200``); "" for
    any other check."""
    if check.how != GPU_KERNEL_TESTS:
        return ""
    return check.detail.rpartition(" on ")[2].strip() if " on " in check.detail else check.detail.strip()


def check_key(check: TorchCheck) -> CheckKey:
    """What one torch check is of: (torch release, CUDA line, how, GPU): ``TorchCheck.key`` and ``check_gpu``."""
    return (*check.key, check_gpu(check))


def merge_reports(earlier: Iterable[TestReport], later: Iterable[TestReport]) -> tuple[TestReport, ...]:
    """Every report of both, one per ``report_key``, a later one winning; sorted by arch, GPU model and torch."""
    merged: dict[ReportKey, TestReport] = {}
    for report in (*earlier, *later):
        merged[report_key(report)] = report
    return tuple(merged[key] for key in sorted(merged, key=_report_order))


def merge_checks(earlier: Iterable[TorchCheck], later: Iterable[TorchCheck]) -> tuple[TorchCheck, ...]:
    """Every check of both, one per ``check_key``: the earlier ones not replaced, in their order, then the later
    ones (a later check of the same key wins)."""
    new: dict[CheckKey, TorchCheck] = {}
    for check in later:
        new.pop(check_key(check), None)  # the last of equal keys, at its own place
        new[check_key(check)] = check
    kept: dict[CheckKey, TorchCheck] = {}
    for check in earlier:
        if check_key(check) not in new:
            kept[check_key(check)] = check
    return (*kept.values(), *new.values())


def merge_records(earlier: BuildRecord, later: BuildRecord, *, earlier_name: str = "the earlier record",
                  later_name: str = "the later record") -> BuildRecord:
    """One record of a wheel from two (the module's rule); ``earlier_name``/``later_name`` name them in the
    RecordMergeError raised for records of two different wheels."""
    for field in ("wheel", "wheel_sha256"):
        a, b = getattr(earlier, field), getattr(later, field)
        if a and b and a != b:
            raise RecordMergeError(
                f"refusing to merge the records {earlier_name} and {later_name}: they are of two different wheels "
                f"({field} {a} and {b}); nothing was changed",
                "merge only the records of one wheel file (the same bytes): a rebuild under the same file name "
                "needs a new build tag")
    reports = merge_reports(earlier.gpu_reports, later.gpu_reports)
    checks = merge_checks(earlier.torch_checks or (), later.torch_checks or ())
    covered = {c.key[:2] for c in checks}
    unchecked = [c for c in merge_checks(earlier.torch_unchecked or (), later.torch_unchecked or ())
                 if c.key[:2] not in covered]
    return later.with_(
        tests=later.tests if later.tests is not None else earlier.tests,
        gpu_tests=reports or None,
        torch_checks=checks if earlier.torch_checks is not None or later.torch_checks is not None else None,
        torch_unchecked=tuple(unchecked) or None,
        wheel=later.wheel or earlier.wheel, wheel_sha256=later.wheel_sha256 or earlier.wheel_sha256,
    )


def _report_order(key: ReportKey) -> tuple[int, str, str, tuple[int, Version] | tuple[int, str]]:
    number, suffix, gpu, torch = key
    try:
        return number, suffix, gpu, (0, Version(torch))
    except InvalidVersion:
        return number, suffix, gpu, (1, torch)
