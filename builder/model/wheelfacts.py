"""One wheel's facts as one frozen value (``Wheel``), made from its file name and, where it has them, its build
record and METADATA: the one place that decides what a wheel is.

From the file name: the name, version, build number, tags, variant label and local label
(model/label.py, the one grammar), and whether it is pure Python (``py3-none-any``). From the record: its ABI and
CUDA, and whether there is one. From METADATA: the torch requirement, one rule (``torch_requirement``). Decided
from those, once: ``stable`` (stable-ABI), ``per_torch_major`` (a per-torch wheel labelled by CUDA major),
``built_once`` (pure Python built once for every torch), ``ranged`` (offered by its torch checks), ``cuda_major``.
Every module that asks one of these (the check chain's BuiltWheel, the index's channels and dashboard rows, the
coverage's cells, fit/install) asks a ``Wheel``; tests/test_architecture.py fails on a label regex or a wheel file
name's local label read anywhere else."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from builder.core.wheelfile import parse_wheel_name, split_label
from builder.model.abi import Abi
from builder.model.cuda import CudaVersion
from builder.model.label import Label, LabelKind
from builder.model.records import BuildRecord


@dataclass(frozen=True, kw_only=True)
class Wheel:
    filename: str
    name: NormalizedName
    version: Version  # with its local label: 1.7.0+cu13torch2.11
    build: int = 0  # its PEP 427 build number (``-1-``): a higher one supersedes the same file; 0 without a build tag
    tags: frozenset[Tag]
    variant: str | None  # a variant wheel's label (PEP 825: sm120); None for a plain wheel
    label: Label | None  # the parsed local label; None for none, or one of another grammar (``local`` keeps it)
    abi: Abi | None = None  # the record's: Abi.TORCH_STABLE; None for a per-torch build or no record
    record_cuda: CudaVersion | None = None  # the record's CUDA; None without one (or pure Python)
    recorded: bool = False  # a build record of it is known
    requires: tuple[str, ...] | None = None  # its METADATA's Requires-Dist lines; None: METADATA not read

    @classmethod
    def of(cls, filename: str, record: BuildRecord | None = None, *, requires: Sequence[str] | None = None) -> Wheel:
        """The wheel named ``filename`` (raises packaging's InvalidWheelFilename for a name that is none), with its
        record's facts and its Requires-Dist lines where given."""
        wheel = cls.named(filename)
        if record is not None:
            wheel = wheel.with_record(abi=record.abi, cuda=record.cuda_version, recorded=True)
        return wheel if requires is None else wheel.with_requires(requires)

    @classmethod
    def named(cls, filename: str) -> Wheel:
        """What the file name alone says."""
        name, version, build, tags = parse_wheel_name(filename)
        return cls(filename=filename, name=name, version=version, build=build[0] if build else 0, tags=tags,
                   variant=split_label(filename)[1], label=Label.parse(version.local))

    def with_record(self, *, abi: str | None, cuda: CudaVersion | None, recorded: bool = True) -> Wheel:
        """The facts a record adds (handed in by a reader that holds no BuildRecord: user/wheelhouse.py's)."""
        return dataclasses.replace(self, abi=Abi(abi) if abi in set(Abi) else None, record_cuda=cuda,
                                   recorded=recorded)

    def with_requires(self, requires: Sequence[str]) -> Wheel:
        """The Requires-Dist lines its METADATA has (``requires_dist``)."""
        return dataclasses.replace(self, requires=tuple(requires))

    @property
    def local(self) -> str | None:
        """The local label as written (``cu13torch2.11``); None for an unlabelled wheel."""
        return self.version.local

    @property
    def pure_python(self) -> bool:
        """Every tag is ``py3-none-any``: any Python 3, any platform, no compiled code."""
        return all(t.interpreter.startswith("py3") and t.abi == "none" and t.platform == "any" for t in self.tags)

    @property
    def abi3(self) -> bool:
        """Every tag is the limited API's (``cp310-abi3``): one file for that Python and each later one."""
        return bool(self.tags) and all(t.abi == "abi3" for t in self.tags)

    @property
    def stable(self) -> bool:
        """A stable-ABI wheel: labelled ``cu13``, or unlabelled with a record whose ABI is ``torch-stable``."""
        if self.local is not None:
            return self.label is not None and self.label.kind == LabelKind.STABLE
        return self.abi == Abi.TORCH_STABLE

    @property
    def per_torch_major(self) -> bool:
        """A per-torch wheel labelled by CUDA major (``cu12torch2.9``): offered on each CUDA line of that major its
        torch checks passed on (an older ``cu128torch2.9`` wheel is in its line's channel alone)."""
        return self.label is not None and self.label.kind == LabelKind.PER_TORCH_MAJOR

    @property
    def per_torch_line(self) -> bool:
        """A per-torch wheel labelled by CUDA line (``cu128torch2.9``, the older shape): in that line's channel."""
        return self.label is not None and self.label.kind == LabelKind.PER_TORCH_LINE

    @property
    def built_once(self) -> bool:
        """A pure-Python wheel built once for every torch: unlabelled, ``py3-none-any`` and recorded (a labelled one
        pins its torch; one without a record is nobody's build, offered in the combined index alone)."""
        return self.local is None and self.pure_python and self.recorded

    @property
    def by_cuda_major(self) -> bool:
        """Offered across the lines of one CUDA major (``cuda_major``): stable-ABI, or per-torch by CUDA major."""
        return self.stable or self.per_torch_major

    @property
    def ranged(self) -> bool:
        """Offered by its torch checks (in the channel of each torch they passed on, none without a record):
        stable-ABI across torches, per-torch by CUDA major across that major's lines, pure Python built once."""
        return self.by_cuda_major or self.built_once

    @property
    def per_torch(self) -> bool:
        """Built against one torch minor (labelled per torch, by line or by major): neither stable-ABI nor pure
        Python built once."""
        return not (self.stable or self.built_once)

    @property
    def cuda_major(self) -> int | None:
        """The CUDA major its code needs: its label's (``cu13``, ``cu12torch2.9``, ``cu130torch2.14``), else an
        unlabelled stable-ABI wheel's record's; None for a wheel bound to no CUDA (pure Python)."""
        if self.label is not None:
            return self.label.cuda_major
        if self.local is None and self.stable and self.record_cuda is not None:
            return self.record_cuda.major
        return None

    @property
    def label_cuda_line(self) -> CudaVersion | None:
        """The CUDA line a line's label names (``cu128torch2.10`` → 12.8); None for any other label."""
        return self.label.cuda_line if self.label is not None else None

    @property
    def torch_requirement(self) -> SpecifierSet | None:
        """Its ``Requires-Dist: torch`` specifier (``torch_requirement``); None where METADATA names no torch or was
        not read."""
        return torch_requirement(self.requires) if self.requires is not None else None


def requires_dist(metadata: bytes | str) -> tuple[str, ...]:
    """The Requires-Dist lines of a METADATA file, as written."""
    text = metadata.decode("utf-8", "replace") if isinstance(metadata, bytes) else metadata
    return tuple(HeaderParser().parsestr(text).get_all("Requires-Dist") or ())


def torch_requirement(requires: Sequence[str]) -> SpecifierSet | None:
    """The one rule for a wheel's torch requirement: the specifiers of every Requires-Dist line on torch that
    applies without extras or with the ``cuda`` extra chosen (a CUDA user's install; fla-core 0.6.0 declares
    ``torch>=2.7.0`` under its ``cuda``, ``rocm`` and ``cpu`` extras and ``torch==2.10.0`` under ``npu``:
    >=2.7.0), joined; other markers are evaluated here. None where no line names torch (any torch)."""
    spec: SpecifierSet | None = None
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and (req.marker is None or req.marker.evaluate({"extra": "cuda"})):
            spec = req.specifier if spec is None else spec & req.specifier
    return spec
