"""A built wheel as one frozen, typed value: made once where a wheel is built (pipeline/run.py, after finalize) or
read from a wheelhouse (pipeline/checks.py ``read_wheel``), then handed to every check of the chain, so no stage
parses the file name or the record's strings again.

Its facts come from two places, each read here and nowhere else: the file name (name, version, local label, tags,
variant label) and the build record (CUDA, archs, ABI, torch floor and build torch, CPU platform)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import NormalizedName
from packaging.version import InvalidVersion, Version

from builder.core.errors import UsageError
from builder.core.wheelfile import parse_wheel_name, split_label
from builder.model.abi import Abi, per_torch_label_parts
from builder.model.arch import Arch, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform, parse_platform
from builder.model.records import BuildRecord


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    path: Path
    name: NormalizedName
    version: Version  # with its local label: 1.7.0+cu13torch2.11
    tags: frozenset[Tag]
    variant: str | None  # a variant wheel's label (PEP 825: sm120); None for a plain wheel
    cuda: CudaVersion | None  # None for pure Python (or a record that names none)
    archs: tuple[Arch, ...]  # () for pure Python
    abi: Abi | None  # Abi.TORCH_STABLE; None for a per-torch build (records write no abi for it)
    torch: Version | None  # the torch it was built against (the build env's: 2.11.0+cu130)
    torch_floor: Version | None  # a stable-ABI wheel's oldest torch (2.11)
    platform: Platform  # the CPU platform it was built for (x86_64, aarch64)
    record: BuildRecord | None  # None: a wheel this builder did not build (or whose record is gone)

    @classmethod
    def made(cls, path: Path, record: BuildRecord | None) -> BuiltWheel:
        """The wheel at ``path`` with its build record: the file name and the record parsed, once."""
        name, version, _, tags = parse_wheel_name(path.name)
        rec = record or BuildRecord()
        try:
            archs = parse_arch_list(",".join(rec.archs)) if rec.archs else ()
        except UsageError:  # a record of another builder: no archs known, the inspection still says what it has
            archs = ()
        return cls(path=path, name=name, version=version, tags=tags, variant=split_label(path.name)[1],
                   cuda=rec.cuda_version, archs=archs, abi=Abi(rec.abi) if rec.abi in set(Abi) else None,
                   torch=_version(rec.python.get("torch")), torch_floor=_version(rec.torch_floor),
                   platform=parse_platform(rec.target_platform, "the record's platform"), record=record)

    @property
    def label(self) -> str | None:
        """The local label: ``cu13torch2.11`` per torch, ``cu13`` stable-ABI, None for a pure-Python wheel."""
        return self.version.local

    @property
    def stable(self) -> bool:
        return self.abi == Abi.TORCH_STABLE

    @property
    def built_once(self) -> bool:
        """A pure-Python wheel built once for every torch: unlabelled and ``py3-none-any`` (its checks say where it
        is offered; a labelled one pins ``torch==``)."""
        return self.label is None and all(
            t.interpreter.startswith("py3") and t.abi == "none" and t.platform == "any" for t in self.tags)

    @property
    def per_torch_major(self) -> bool:
        """A per-torch wheel labelled by CUDA major (``cu12torch2.9``): offered on each CUDA line of that major its
        torch checks passed on (an older ``cu128torch2.9`` wheel is in its line's channel alone)."""
        return per_torch_label_parts(self.label) is not None

    @property
    def ranged(self) -> bool:
        """Offered by its torch checks (with a record): stable-ABI across torches, pure Python built once across
        torches, a per-torch wheel labelled by CUDA major across that major's lines."""
        return self.record is not None and (self.stable or self.built_once or self.per_torch_major)

    @property
    def build_python(self) -> str:
        """The Python it was built (and import-tested) with, ``3.12`` (empty where the record names none)."""
        version = str((self.record.python if self.record else {}).get("version") or "")
        return ".".join(version.split(".")[:2]) if version.count(".") >= 1 else ""

    def with_record(self, record: BuildRecord) -> BuiltWheel:
        """The same file with a record that has more in it (tests, checks): the facts above do not change."""
        return dataclasses.replace(self, record=record)


def _version(text: object) -> Version | None:
    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None
