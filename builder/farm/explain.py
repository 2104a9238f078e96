"""``builder coverage --explain PLATFORM/CUDA/TORCH/PYTHON``: where each fact of one cell came from.

For the torch minor on that platform, every release each index lists: the CUDA its wheels for that platform carry
(or "unknown": not read), read from which wheel (name, URL, sha256, when; from the index now, the cache or the
shipped snapshot), the Pythons of that platform's wheel names and the triton it pins. Then, per package, the status
coverage gives the cell, the wheel and record it comes from, or the reason it is missing (farm/coverage.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from builder.core.errors import UsageError
from builder.discovery.compat import TorchIndex
from builder.discovery.torchindex import Release
from builder.farm.coverage import PackageCoverage
from builder.farm.served import Cell
from builder.model.abi import torch_minor
from builder.model.platform import PLATFORMS

SPEC_HELP = "PLATFORM/CUDA/TORCH/PYTHON, e.g. aarch64/13.0/2.11/3.12 (CUDA may be *: every line)"


@dataclass(frozen=True)
class CellQuery:
    """The cell asked about; ``cuda`` None: every CUDA line."""

    platform: str
    cuda: str | None
    torch: str
    python: str

    def matches(self, cell: Cell) -> bool:
        return (cell.platform == self.platform and cell.torch == self.torch and cell.python == self.python
                and (self.cuda is None or cell.cuda == self.cuda))

    def text(self) -> str:
        return f"{self.platform}, CUDA {self.cuda or 'any'}, torch {self.torch}, Python {self.python}"


def parse_cell(spec: str) -> CellQuery:
    """``aarch64/13.0/2.11/3.12`` → CellQuery; a clear error naming the part at fault otherwise."""
    parts = spec.strip().split("/")
    if len(parts) != 4:
        raise UsageError(f"--explain {spec!r}: four parts expected", f"write {SPEC_HELP}")
    platform, cuda, torch, python = (p.strip() for p in parts)
    if platform not in PLATFORMS:
        raise UsageError(f"--explain {spec!r}: unknown platform {platform!r}", f"use one of {', '.join(PLATFORMS)}")
    for name, value in (("CUDA", cuda), ("torch", torch), ("Python", python)):
        if name == "CUDA" and value == "*":
            continue
        try:
            parsed = Version(value)
        except InvalidVersion:
            raise UsageError(f"--explain {spec!r}: the {name} part {value!r} is not a version",
                             f"write {SPEC_HELP}") from None
        if len(parsed.release) != 2:
            raise UsageError(f"--explain {spec!r}: the {name} part {value!r} is not MAJOR.MINOR",
                             f"write {SPEC_HELP}")
    return CellQuery(platform, None if cuda == "*" else cuda, torch, python)


def release_lines(query: CellQuery, indexes: Iterable[TorchIndex]) -> list[str]:
    """One block per torch release of the query's minor on each index: the facts of its ``platform`` wheels."""
    lines: list[str] = []
    for index in indexes:
        releases = [r for r in (index.listing.releases if index.listing else ())
                    if "{}.{}".format(*torch_minor(r.version)) == query.torch]
        if not releases:
            lines.append(f"{index.name}: no torch {query.torch} release listed ({index.source})")
            continue
        for release in releases:
            lines += _release_block(index, release, query.platform)
    return lines


def _release_block(index: TorchIndex, release: Release, platform: str) -> list[str]:
    facts = release.on(platform)
    cuda = release.cuda_on(platform)
    head = f"{index.name} torch {release.version} on {platform}: CUDA {cuda or 'unknown'}"
    if facts is None:
        if cuda is None:
            return [f"{head} (its {platform} wheels were not read; the listing says: {release.evidence}; "
                    f"from the {index.source})"]
        pythons = ", ".join(release.pythons) or "not listed (the matrix takes those of the same release elsewhere)"
        return [f"{head} ({release.evidence}; read {release.read_at or '?'} from the {index.source}; "
                f"Pythons {pythons})"]
    return [f"{head} ({facts.evidence})",
            f"    wheel {facts.url or facts.wheel or '?'}",
            f"    sha256 {facts.sha256 or 'not given by the index'}; read {facts.read_at or '?'}; from the "
            f"{index.source}; Pythons {', '.join(facts.pythons) or 'none'}; triton pin {facts.triton or 'none'}"]


def package_lines(query: CellQuery, report: PackageCoverage) -> list[str]:
    """What coverage says of the query's cells for one package version, with the wheel and record behind it."""
    found = [c for c in report.cells if query.matches(c.cell)]
    if not found:
        return [f"{report.package} {report.version}: not a cell of the users' matrix (no index offers a CUDA torch "
                f"{query.torch} for Python {query.python} on {query.platform}"
                + (f" with CUDA {query.cuda}" if query.cuda else "") + "; see the torch facts above)"]
    lines = []
    for c in found:
        where = f"; wheel {c.wheel} (record records/{c.wheel}.json)" if c.wheel else ""
        said = c.evidence if c.evidence.startswith(c.status) else f"{c.status}: {c.evidence}"
        lines.append(f"{report.package} {report.version} CUDA {c.cell.cuda}: {said}{where}")
    return lines
