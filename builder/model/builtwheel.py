"""A built wheel as one frozen, typed value: made once where a wheel is built (pipeline/run.py, after finalize) or
read from a wheelhouse (pipeline/checks.py ``read_wheel``), then handed to every check of the chain, so no stage
parses the file name or the record's strings again.

What the wheel is (name, version, tags, variant label, local label, CUDA, ABI; stable, ranged, built once) is its
``facts``, the one wheel value (model/wheelfacts.py); what only a build of ours has (archs, torch floor and build
torch, CPU platform) is read from the build record here and nowhere else."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import NormalizedName
from packaging.version import InvalidVersion, Version

from builder.model.abi import Abi
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform, parse_platform
from builder.model.records import BuildRecord
from builder.model.wheelfacts import Wheel


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    path: Path
    facts: Wheel  # what the file name and the record say it is (model/wheelfacts.py): label, stable, ranged, ...
    archs: tuple[Arch, ...]  # () for pure Python
    torch: Version | None  # the torch it was built against (the build env's: 2.11.0+cu130)
    torch_floor: Version | None  # a stable-ABI wheel's oldest torch (2.11)
    platform: Platform  # the CPU platform it was built for (x86_64, aarch64)
    record: BuildRecord | None  # None: a wheel this builder did not build (or whose record is gone)

    @classmethod
    def made(cls, path: Path, record: BuildRecord | None) -> BuiltWheel:
        """The wheel at ``path`` with its build record: the file name and the record parsed, once."""
        rec = record or BuildRecord()  # a record of another builder: no archs known, the inspection says what it has
        return cls(path=path, facts=Wheel.of(path.name, record), archs=rec.arch_list,
                   torch=rec.build_torch, torch_floor=_version(rec.torch_floor),
                   platform=parse_platform(rec.target_platform, "the record's platform"), record=record)

    @property
    def name(self) -> NormalizedName:
        return self.facts.name

    @property
    def version(self) -> Version:
        """With its local label: 1.7.0+cu13torch2.11."""
        return self.facts.version

    @property
    def tags(self) -> frozenset[Tag]:
        return self.facts.tags

    @property
    def variant(self) -> str | None:
        """A variant wheel's label (PEP 825: sm120); None for a plain wheel."""
        return self.facts.variant

    @property
    def cuda(self) -> CudaVersion | None:
        """Its record's CUDA; None for pure Python (or a record that names none)."""
        return self.facts.record_cuda

    @property
    def abi(self) -> Abi | None:
        """Abi.TORCH_STABLE; None for a per-torch build (records write no abi for it)."""
        return self.facts.abi

    @property
    def label(self) -> str | None:
        """The local label: ``cu13torch2.11`` per torch, ``cu13`` stable-ABI, None for a pure-Python wheel."""
        return self.facts.local

    @property
    def stable(self) -> bool:
        return self.facts.stable

    @property
    def built_once(self) -> bool:
        return self.facts.built_once

    @property
    def per_torch_major(self) -> bool:
        return self.facts.per_torch_major

    @property
    def ranged(self) -> bool:
        return self.facts.ranged

    @property
    def build_python(self) -> str:
        """The Python it was built (and import-tested) with, ``3.12`` (empty where the record names none)."""
        version = (self.record.build_python if self.record else None) or ""
        return ".".join(version.split(".")[:2]) if version.count(".") >= 1 else ""

    def with_record(self, record: BuildRecord) -> BuiltWheel:
        """The same file with a record that has more in it (tests, checks): the facts above do not change."""
        return dataclasses.replace(self, record=record, facts=dataclasses.replace(self.facts, recorded=True))


def _version(text: object) -> Version | None:
    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None
