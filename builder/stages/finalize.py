"""The finalize stage: local version label in name and METADATA, torch pinned, build record inside .dist-info."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, overload

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.core.errors import InspectError
from builder.core.wheelfile import (
    dist_info_dir,
    modes,
    read_entries,
    set_wheel_build,
    tag_part,
    with_build,
    write_wheel,
)
from builder.model.records import BuildRecord

RECORD_FILE = "cuda_wheel_builder.json"
# nvcc names its temp files tmpxft_<pid>_…; the name lands in the .so's symbol table as a FILE symbol, the only
# thing that differed between two builds of the same inputs. Same length, so offsets do not move.
_NVCC_TMP = re.compile(rb"tmpxft_[0-9a-f]{8}_")


def labelled_version(version: Version, label: str) -> Version:
    """``1.7.0`` + ``cu130torch2.11`` → ``1.7.0+cu130torch2.11`` (an existing local part is extended)."""
    return Version(f"{version}.{label}" if version.local else f"{version}+{label}")


def finalize_wheel(
    wheel: Path,
    outdir: Path,
    *,
    label: str | None,
    pins: list[str],
    build_record: BuildRecord,
    drop: tuple[str, ...] = (),
    requires_python: str | None = None,
) -> Path:
    """Rewrite ``wheel`` into ``outdir`` with the label, the pins (replacing same-named requirements), the record,
    ``requires_python`` as its lower bound (where given: Plan.requires_python), and without the Requires-Dist
    entries a recipe's ``[runtime] drop`` names. The record's build number (``BuildRecord.build``, from the
    recipe's fix patches) becomes the PEP 427 build tag of the file name and the WHEEL file's ``Build:`` line
    (none for build 0: the name as before)."""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    entries = read_entries(wheel)
    file_modes = modes(wheel)
    old_info = dist_info_dir(entries, wheel.name)
    new_version = labelled_version(version, label) if label else version
    dist_name = old_info.removesuffix(".dist-info").rsplit("-", 1)[0]
    new_info = f"{dist_name}-{new_version}.dist-info"
    renamed: dict[str, bytes] = {}
    renamed_modes: dict[str, int] = {}
    for entry, data in entries.items():
        new_entry = new_info + entry[len(old_info):] if entry.startswith(old_info + "/") else entry
        renamed[new_entry] = _NVCC_TMP.sub(b"tmpxft_00000000_", data) if entry.endswith(".so") else data
        renamed_modes[new_entry] = file_modes.get(entry, 0o644)
    metadata_name = f"{new_info}/METADATA"
    if metadata_name not in renamed:
        raise InspectError(f"{wheel.name}: no METADATA in {old_info}")
    renamed[metadata_name] = rewrite_metadata(renamed[metadata_name].decode(), new_version, pins, drop,
                                              requires_python).encode()
    renamed[f"{new_info}/{RECORD_FILE}"] = build_record.wheel_bytes()
    wheel_file = f"{new_info}/WHEEL"
    if wheel_file in renamed:
        renamed[wheel_file] = set_wheel_build(renamed[wheel_file].decode(), build_record.build_number).encode()
    out = outdir / with_build(f"{dist_name}-{new_version}-{tag_part(wheel.name)}.whl", build_record.build_number)
    outdir.mkdir(parents=True, exist_ok=True)
    write_wheel(out, renamed, new_info, renamed_modes)
    parse_wheel_filename(out.name)  # sanity: the new name is a valid wheel name
    assert canonicalize_name(name) == canonicalize_name(parse_wheel_filename(out.name)[0])
    return out


def rewrite_metadata(text: str, version: Version, pins: list[str], drop: tuple[str, ...] = (),
                     requires_python: str | None = None) -> str:
    """Set ``Version:``, replace unconditional Requires-Dist lines whose name a pin names, and remove every
    Requires-Dist line (with or without a marker) whose name ``drop`` names. ``requires_python`` (``>=3.10``)
    raises Requires-Python's lower bound to it (upstream's other bounds and a higher floor of its own are kept)."""
    head, sep, body = text.partition("\n\n")
    pinned = {canonicalize_name(Requirement(p).name) for p in pins}
    dropped = {canonicalize_name(n) for n in drop}
    lines: list[str] = []
    for line in head.splitlines():
        if line.startswith("Version:"):
            lines.append(f"Version: {version}")
            if requires_python and not any(x.startswith("Requires-Python:") for x in head.splitlines()):
                lines.append(f"Requires-Python: {requires_python}")
            continue
        if line.startswith("Requires-Python:") and requires_python:
            lines.append(f"Requires-Python: {raised_floor(line.split(':', 1)[1].strip(), requires_python)}")
            continue
        if line.startswith("Requires-Dist:"):
            try:
                req = Requirement(line.split(":", 1)[1].strip())
            except InvalidRequirement:
                lines.append(line)
                continue
            if canonicalize_name(req.name) in dropped:
                continue
            if canonicalize_name(req.name) in pinned and req.marker is None:
                continue
        lines.append(line)
    lines.extend(f"Requires-Dist: {p}" for p in pins)
    return "\n".join(lines) + (sep + body if sep else "\n")


def raised_floor(specifier: str, floor: str) -> str:
    """``>=3.9`` raised to ``>=3.10`` → ``>=3.10``; ``>=3.9,<3.15`` → ``<3.15,>=3.10``; a lower bound at or above
    the floor is kept as it is (``>=3.11`` stays)."""
    try:
        specs = SpecifierSet(specifier)
    except InvalidSpecifier:
        return floor
    low = Version(Specifier(floor).version)
    kept = [s for s in specs if not (s.operator in (">=", ">") and Version(s.version) < low)]
    if not any(s.operator in (">=", ">") for s in kept):
        kept.append(Specifier(floor))
    return str(SpecifierSet(",".join(str(s) for s in kept)))


def read_build_record(wheel: Path) -> BuildRecord | None:
    entries = read_entries(wheel)
    info = dist_info_dir(entries, wheel.name)
    data = entries.get(f"{info}/{RECORD_FILE}")
    try:
        loaded = json.loads(data) if data else None
        return BuildRecord.from_json(loaded) if isinstance(loaded, dict) else None
    except (ValueError, RecursionError) as e:  # RecordShapeError names the field
        raise InspectError(f"{wheel}: its build record {info}/{RECORD_FILE} is damaged: {e}",
                           "rebuild the wheel (its record is written by finalize)") from e


def read_metadata(wheel: Path) -> str:
    entries = read_entries(wheel)
    return entries[f"{dist_info_dir(entries, wheel.name)}/METADATA"].decode()


CACHE_PLACEHOLDER = "$BUILDER_CACHE_DIR"


def portable_record(record: BuildRecord, cache_dir: Path) -> BuildRecord:
    """The build record as it goes into the wheel: paths inside the builder's cache (the build venv, a PyPI
    toolkit, the log) written relative to ``$BUILDER_CACHE_DIR``, so the same inputs built under another cache
    give the same bytes. The wheelhouse record keeps the real paths."""
    return BuildRecord.from_json(portable_paths(record.to_json(), cache_dir))


@overload
def portable_paths(value: dict[str, Any], cache_dir: Path) -> dict[str, Any]: ...


@overload
def portable_paths(value: object, cache_dir: Path) -> object: ...


def portable_paths(value: object, cache_dir: Path) -> object:
    prefix = str(cache_dir).rstrip("/")
    if isinstance(value, dict):
        return {key: portable_paths(item, cache_dir) for key, item in value.items()}
    if isinstance(value, list):
        return [portable_paths(item, cache_dir) for item in value]
    if isinstance(value, str) and prefix in value:
        return re.sub(re.escape(prefix) + r"(?![\w.-])", lambda _: CACHE_PLACEHOLDER, value)
    return value
