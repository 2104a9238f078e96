"""Which indexes list a wheel: the channels (``channels/<label>/simple/``) of its label or of the torches its checks
passed on, and whether the combined index (``simple/``) lists it beside PyPI's torches (docs/INDEX.md)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename
from packaging.version import InvalidVersion, Version

from builder.discovery.compat import resolve_index
from builder.model.abi import cuda_line_major, torch_minor
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord
from builder.model.wheelfacts import Wheel, requires_dist, torch_requirement


def wheel_label(filename: str) -> str | None:
    """The local version label of a wheel file name: ``x-1.7.0+cu130torch2.14-…`` → ``cu130torch2.14``."""
    return Wheel.named(filename).local


def wheel_channels(filename: str, record: BuildRecord | None) -> tuple[str, ...]:
    """The channels (``channels/<label>/simple/``) that list a wheel, sorted; every wheel is in the combined index
    besides. The one place that decides it: the pages, ``listed``, ``Wheelhouse.labels`` and the dashboard ask here.

    A per-torch wheel labelled by CUDA line (``+cu130torch2.14``, the older shape) is in the channel of its own label,
    whatever its record says (it pins that torch minor); an unlabelled wheel in none. One labelled by CUDA major
    (``+cu13torch2.14``) is in the channel of each line of that major its record's checks passed on for that torch
    minor (``cu130torch2.14``, ``cu132torch2.14``), as a stable wheel is for its torches. A stable-ABI wheel (label
    ``+cu13``, or unlabelled with a record whose ``abi`` is ``torch-stable``) is in the channel of each torch it was
    verified on (``TorchCheck.channel``: ``cu130torch2.12``), never in one named ``cu13``: a channel where a check
    passed and none failed (a failed check on torch 2.12.1 keeps the wheel from that channel, whose users may have
    2.12.1, even where 2.12.0 passed), whose CUDA major is the wheel's, and whose torch is at or above the record's
    torch floor. Without a record, or without such a check, it is in no channel.

    An unlabelled pure-Python wheel (``py3-none-any``: built once per version, for every torch and CUDA) is offered
    the same way, in the channel of each torch its record's checks passed on, with no CUDA major or floor to meet.
    What a wheel is (stable, per torch by major, built once: ``ranged``) is model/wheelfacts.py's to say."""
    try:
        wheel = Wheel.of(filename, record)
    except InvalidWheelFilename:  # a file dropped into wheels/ by hand: publish and rebuild refuse it, it has no channel
        return ()
    if not wheel.ranged:
        return (wheel.local,) if wheel.local else ()  # a line's per-torch label decides, whatever the record says
    major = wheel.cuda_major if wheel.by_cuda_major else None  # pure Python: every CUDA
    only_minor = wheel.label.torch if wheel.per_torch_major and wheel.label else None
    if record is None:
        return ()
    try:
        floor = torch_minor(record.torch_floor) if record.torch_floor else None
    except InvalidVersion:  # a floor that is no version: nothing can be judged against it
        return ()
    passed: set[str] = set()
    failed: set[str] = set()
    for check in record.torch_checks or ():
        try:
            channel, minor, cuda = check.channel, torch_minor(check.torch), CudaVersion.parse(check.cuda)
        except InvalidVersion:  # a check naming no torch or CUDA offers nothing
            continue
        if ((major is None or cuda.major == major) and (floor is None or minor >= floor)
                and (only_minor is None or minor == only_minor)):
            (passed if check.passed else failed).add(channel)
    return tuple(sorted(passed - failed))


PypiTorch = Sequence[tuple[str, str | None]]  # (torch release, its CUDA line, "cpu" or None) as PyPI builds it


@cache
def pypi_torch() -> tuple[tuple[str, str | None], ...]:
    """PyPI's torch releases and the CUDA line each is built for, from discovery's shipped snapshot (read from each
    release's METADATA when it was written; no cache, no network): every machine renders the same pages from the
    same wheelhouse (``builder index pull`` relies on it). A release of a new CUDA major is seen once the snapshot
    is rewritten (``builder torch-table --write-snapshot``)."""
    listing = resolve_index("pypi").listing
    return tuple((r.version, r.cuda) for r in listing.releases) if listing else ()


def wheel_cuda_major(filename: str, record: BuildRecord | None) -> int | None:
    """The CUDA major a wheel's code needs (``Wheel.cuda_major``); None for a wheel bound to no CUDA (pure Python) or
    a file name that is none."""
    try:
        return Wheel.of(filename, record).cuda_major
    except InvalidWheelFilename:
        return None


def torch_specifier(metadata: bytes | str) -> SpecifierSet:
    """What a wheel's METADATA lets a resolver pair it with: its torch requirement (model/wheelfacts.py
    ``torch_requirement``, the one rule; empty: any torch)."""
    return torch_requirement(requires_dist(metadata)) or SpecifierSet()


def root_lists(filename: str, record: BuildRecord | None, metadata: bytes | str,
               pypi: PypiTorch | None = None) -> bool:
    """Whether the combined index (``simple/``) lists a wheel. Its users take torch from PyPI (docs/INDEX.md), and a
    resolver there pairs a wheel with any torch its requirement admits: so a wheel built for CUDA major M is listed
    only where every PyPI torch release its ``Requires-Dist: torch`` admits is a CUDA M build, and at least one is.
    The ``+cu13`` stable wheel (``torch>=2.11``: PyPI's 2.11.0 on are CUDA 13) and ``+cu12torch2.10`` (PyPI's
    2.10.0 is CUDA 12.8) are listed; ``+cu12torch2.11`` and ``+cu13torch2.10`` (PyPI's 2.11.0 is CUDA 13, its
    2.10.0 CUDA 12.8) and the ``+cu12`` stable wheel (``torch>=2.10`` admits PyPI's CUDA 13 torches) are in their
    channels only. A release whose CUDA is unknown counts against the wheel. A wheel bound to no CUDA is listed.
    ``pypi``: PyPI's (release, CUDA line) pairs; the shipped snapshot's by default (``pypi_torch``)."""
    major = wheel_cuda_major(filename, record)
    if major is None:
        return True
    spec = torch_specifier(metadata)
    releases = pypi_torch() if pypi is None else pypi
    admitted = [cuda for version, cuda in releases if spec.contains(Version(version), prereleases=True)]
    return bool(admitted) and all(cuda_line_major(cuda or "") == major for cuda in admitted)
