"""`builder index merge`: other wheelhouses' wheels and records (the nightly's promoted folder of each GPU test
job) merged into this one, by the one record merge rule (model/recordmerge.py).

``plan_merge`` only reads: it checks every wheel (one file name, one set of bytes, here and in every source) and
every record (of that wheel: its ``wheel_sha256`` and ``wheel`` agree) and merges the records in order (this
wheelhouse's own first, then each source's as given: a later report or check of the same key wins). Any refusal is
a RecordMergeError naming both files, raised before anything is staged; ``Wheelhouse.merge_from`` (index/store.py)
then writes what the plan says in one transaction with the pages, under the wheelhouse's lock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from builder.core.errors import PublishError
from builder.core.fsutil import sha256_file
from builder.index.layout import recorded_wheel
from builder.model.recordmerge import RecordMergeError, merge_records
from builder.model.records import BuildRecord

if TYPE_CHECKING:
    from builder.index.store import Wheelhouse

_SAME_NAME_CURE = ("a rebuild under a file name already used needs a new build tag or version; publish only one "
                   "of the two")


@dataclass
class MergePlan:
    """What merging the sources into a wheelhouse changes: wheels to copy in, records to write."""

    new_wheels: dict[str, Path] = field(default_factory=dict)  # file name → a source's copy (not here yet)
    kept_wheels: list[str] = field(default_factory=list)  # here already, with the same bytes
    digests: dict[str, str] = field(default_factory=dict)  # file name → sha256 of its bytes
    records: dict[str, BuildRecord] = field(default_factory=dict)  # file name → its merged record, where it changes
    merged_from: dict[str, list[Path]] = field(default_factory=dict)  # file name → the record files merged, in order


def plan_merge(house: Wheelhouse, sources: Sequence[Wheelhouse]) -> MergePlan:
    """What merging ``sources`` into ``house`` (in that order) writes; RecordMergeError (nothing staged yet) for
    other bytes under one file name, a record of another wheel or without its wheel, a source that is no
    wheelhouse. The caller holds ``house``'s lock."""
    plan = MergePlan()
    holders: dict[str, Path] = {}  # file name → the first file seen with it (for messages)
    for source in sources:
        if not source.wheels.is_dir() and not source.records.is_dir():
            raise RecordMergeError(f"{source.root} holds no wheels/ or records/ folder: not a wheelhouse to merge "
                                   "from; nothing was changed", "name the folder that holds wheels/ and records/")
        for wheel in source.wheel_files():
            _add_wheel(house, wheel, plan, holders)
    read: dict[str, list[tuple[Path, BuildRecord]]] = {}
    for source in sources:
        for path in source.record_files():
            name = recorded_wheel(path)
            digest = plan.digests.get(name) or _held_digest(house, name, plan)
            if digest is None:
                raise RecordMergeError(f"{path}: a record without its wheel {name} (in no source's wheels/ nor in "
                                       f"{house.wheels}); nothing was changed",
                                       "merge the folder that holds the wheel too, or delete the stray record")
            record = _read(source, name, path)
            _check_of(record, name, digest, path)
            read.setdefault(name, []).append((path, record))
    for name, records in read.items():
        here = house.record_file(name)
        merged = _read(house, name, here) if here.is_file() else None
        shown = str(here)
        for path, record in records:
            merged = record if merged is None else merge_records(merged, record, earlier_name=shown,
                                                                 later_name=str(path))
            shown = str(path)
        assert merged is not None
        merged = merged.with_(wheel_sha256=plan.digests[name])
        plan.merged_from[name] = [path for path, _ in records]
        if not here.is_file() or here.read_bytes() != merged.file_bytes():
            plan.records[name] = merged
    return plan


def _add_wheel(house: Wheelhouse, wheel: Path, plan: MergePlan, holders: dict[str, Path]) -> None:
    digest = sha256_file(wheel)
    name = wheel.name
    first = holders.setdefault(name, wheel)
    if name in plan.digests:
        if plan.digests[name] != digest:
            raise RecordMergeError(f"refusing to merge {wheel}: {first} has other bytes under the same file name "
                                   f"(sha256 {plan.digests[name]}, this file {digest}); nothing was changed",
                                   _SAME_NAME_CURE)
        return
    plan.digests[name] = digest
    here = house.wheel_file(name)
    if here.is_file():
        held = sha256_file(here)
        if held != digest:
            raise RecordMergeError(f"refusing to merge {wheel}: {here} has other bytes under the same file name "
                                   f"(sha256 {held}, this file {digest}); nothing was changed", _SAME_NAME_CURE)
        plan.kept_wheels.append(name)
    else:
        plan.new_wheels[name] = wheel


def _held_digest(house: Wheelhouse, name: str, plan: MergePlan) -> str | None:
    """The sha256 of a wheel only this wheelhouse holds (a source brings its record alone), noted in the plan."""
    here = house.wheel_file(name)
    if not here.is_file():
        return None
    plan.digests[name] = sha256_file(here)
    return plan.digests[name]


def _read(area: Wheelhouse, name: str, path: Path) -> BuildRecord:
    try:
        record = area.record_of(name)
    except (OSError, json.JSONDecodeError, RecursionError) as e:
        raise RecordMergeError(f"{path}: not a readable build record ({e}); nothing was changed",
                               "fix or delete that record, then merge again") from e
    except PublishError as e:  # a field of the wrong type, or too large: the store's message names it
        raise RecordMergeError(e.message, e.hint) from e
    if record is None:
        raise RecordMergeError(f"{path}: not a JSON object, so not a build record; nothing was changed",
                               "fix or delete that record, then merge again")
    return record


def _check_of(record: BuildRecord, name: str, digest: str, path: Path) -> None:
    """A record names the wheel it sits beside: the same file name and sha256, where it names them."""
    if record.wheel and record.wheel != name:
        raise RecordMergeError(f"{path}: the record of {record.wheel}, not of {name}; nothing was changed",
                               "put each record under its own wheel's name (records/<wheel>.json)")
    if record.wheel_sha256 and record.wheel_sha256 != digest:
        raise RecordMergeError(f"{path}: the record of a wheel with sha256 {record.wheel_sha256}, not of {name} "
                               f"(sha256 {digest}); nothing was changed",
                               "merge the record with the wheel it was written for: " + _SAME_NAME_CURE)
