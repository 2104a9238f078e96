"""The order a farm starts its builds in: longest first (issue 19).

With N workers and targets of very different lengths (a mamba-ssm compile of minutes beside pure-Python wheels of
seconds), file order can start a long build last, while the other workers idle: the farm then ends one long build
after everything else. Starting the longest first (LPT scheduling) bounds the whole run at 4/3 of the best order.

A target's length is what its last build took, read from the wheelhouse's records (their ``timings``: every stage
of that build), matched on package, platform, CUDA, arch list and toolchain, else on the package alone (scaled by
the number of archs; a build for the same platform first: a cross build of aarch64 code here takes its own time). A target never built is assumed long (``UNKNOWN_CUDA_SECONDS`` per arch): a new heavy recipe should not
start last. Ties keep the farm file's order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.farm.spec import FarmTarget
from builder.index.layout import Layout
from builder.model.arch import format_arch_list

UNKNOWN_CUDA_SECONDS = 600.0  # per arch, for a CUDA target with no past build (causal-conv1d sm_120 here: ~220 s)
UNKNOWN_PURE_SECONDS = 10.0


@dataclass(frozen=True)
class PastBuild:
    package: str
    cuda: str
    archs: str  # "90,120+ptx"
    toolchain: str  # the record's toolkit kind: pip, host, docker, or "none (pure Python)"
    seconds: float
    platform: str = "x86_64"  # the record's platform (records before the platform axis: x86_64)


@dataclass(frozen=True)
class Estimate:
    target: FarmTarget
    seconds: float
    basis: str  # "past build" | "past build of the package" | "no past build"


def past_builds(wheelhouses: Iterable[Path]) -> list[PastBuild]:
    """Every record with timings in these wheelhouses (records/*.whl.json; a record that does not parse is skipped:
    the order is a hint, never a reason to fail)."""
    found = []
    for house in wheelhouses:
        for path in Layout(house).record_files():
            try:
                data = json.loads(path.read_text())
                seconds = sum(float(v) for v in (data.get("timings") or {}).values())
                found.append(PastBuild(package=canonicalize_name(str(data.get("package", ""))),
                                       cuda=str(data.get("cuda", "")), archs=",".join(data.get("archs") or ()),
                                       toolchain=str((data.get("toolchain") or {}).get("kind", "")), seconds=seconds,
                                       platform=str(data.get("platform") or "x86_64")))
            except (OSError, ValueError, TypeError, AttributeError):
                continue
    return [b for b in found if b.seconds > 0]


def estimate(target: FarmTarget, past: list[PastBuild]) -> Estimate:
    package = canonicalize_name(target.package)
    cuda = target.kind.is_cuda
    archs = format_arch_list(target.archs) if cuda else ""
    toolchain = target.toolchain if cuda else "none (pure Python)"
    platform = target.platform.name
    same = [b for b in past if b.package == package and b.archs == archs
            and (not cuda or (b.cuda == str(target.cuda) and toolchain in ("auto", b.toolchain)
                              and b.platform == platform))]
    if same:
        return Estimate(target, max(b.seconds for b in same), "past build")
    n = max(1, len(target.archs)) if cuda else 1
    of_package = [b for b in past if b.package == package]
    of_package = [b for b in of_package if b.platform == platform] or of_package
    per_arch = [b.seconds / max(1, len(b.archs.split(","))) for b in of_package]
    if per_arch:
        return Estimate(target, max(per_arch) * n, "past build of the package")
    return Estimate(target, UNKNOWN_CUDA_SECONDS * n if cuda else UNKNOWN_PURE_SECONDS, "no past build")


def longest_first(targets: list[FarmTarget], past: list[PastBuild]) -> list[Estimate]:
    """The targets with their estimates, longest first (a stable sort: ties keep the file's order)."""
    return sorted((estimate(t, past) for t in targets), key=lambda e: -e.seconds)
