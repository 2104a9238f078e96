"""The facts discovery reads about torch: one release's wheels per platform (``PlatformFacts``), one release on one
index (``Release``), and what one index serves (``Listing``). Made by discovery/classify.py and torchindex.py; read
by coverage, plans and doctor."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from packaging.version import Version


@dataclass(frozen=True)
class PlatformFacts:
    """What one torch release's wheels for one CPU platform are, read from one of them: its CUDA ("13.0", "cpu",
    None where it could not be read), the Pythons of that platform's wheel names, the triton it pins (``triton==X``
    in its METADATA for that platform), and where the facts came from (the wheel's name, URL and sha256 as the page
    gave them, and when they were read). A wheel file never changes, so these never go stale."""

    platform: str  # x86_64 | aarch64
    cuda: str | None
    pythons: tuple[str, ...]
    evidence: str  # "METADATA: cuda-toolkit[...]==13.0.2 (PEP 658)", "+cu128 label", ...
    wheel: str = ""
    url: str = ""
    sha256: str = ""
    read_at: str = ""
    triton: str | None = None


@dataclass(frozen=True)
class Release:
    """One torch release on one index: its CUDA ("13.2", "cpu", or None when it could not be read), as its x86_64
    wheels have it, and what each platform's wheels have (``platforms``; absent in listings written before the
    platform facts were read, and in release-notes rows: the other platforms are then unknown)."""

    version: str  # public version: 2.11.0 (also for 2.11.0+cu128 on a channel)
    cuda: str | None
    pythons: tuple[str, ...]  # 3.11, 3.12, 3.13t ... from the wheel names
    evidence: str  # how the CUDA was read: "METADATA: cuda-toolkit==13.2.2", "+cu128 label", ...
    read_at: str  # when the CUDA was read (ISO time, UTC)
    uploaded: str = ""  # its first wheel's upload time (PEP 700 ``upload-time``, ISO UTC); "" where not served
    platforms: tuple[PlatformFacts, ...] = ()

    def on(self, platform: str) -> PlatformFacts | None:
        """The facts read from this release's wheels for ``platform``; None where none were read."""
        return next((f for f in self.platforms if f.platform == platform), None)

    def cuda_on(self, platform: str) -> str | None:
        """The CUDA ("12.8", "cpu") of this release's ``platform`` wheels; None where unknown. A release without
        platform facts answers for x86_64 alone (its ``cuda`` was read from an x86_64 wheel or release notes)."""
        facts = self.on(platform)
        if facts is not None:
            return facts.cuda
        return self.cuda if platform == "x86_64" and not self.platforms else None

    def pythons_on(self, platform: str) -> tuple[str, ...]:
        """The Pythons of this release's ``platform`` wheels (the release's where no platform facts were read)."""
        facts = self.on(platform)
        return facts.pythons if facts is not None else self.pythons


@dataclass(frozen=True)
class Listing:
    """What one index serves; ``source`` is where this answer came from: index, cache or snapshot."""

    name: str
    url: str
    releases: tuple[Release, ...]
    source: str
    read_at: str  # when the release list was read from the index
    note: str = ""

    def torch_by_cuda(self) -> dict[str, tuple[str, ...]]:
        table: dict[str, list[str]] = {}
        for release in self.releases:
            if release.cuda is not None:
                table.setdefault(release.cuda, []).append(release.version)
        return {cuda: tuple(sorted(v, key=Version)) for cuda, v in sorted(table.items(), key=lambda kv: _cuda_order(kv[0]))}

    def release(self, version: str) -> Release | None:
        return self._by_version.get(Version(Version(version).public))

    @functools.cached_property
    def _by_version(self) -> dict[Version, Release]:
        found: dict[Version, Release] = {}
        for r in self.releases:
            found.setdefault(Version(r.version), r)
        return found


def _cuda_order(cuda: str) -> tuple[int, Version]:
    return (1, Version(cuda)) if cuda[:1].isdigit() else (0, Version("0"))
