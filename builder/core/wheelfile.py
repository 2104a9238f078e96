"""Reading and rewriting wheels: entries sorted, timestamps fixed, RECORD regenerated (reproducible output)."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.core.errors import InspectError

EPOCH_MIN = 315532800  # 1980-01-01, the earliest time a zip can hold


def read_entries(wheel: Path) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return {info.filename: zf.read(info) for info in zf.infolist() if not info.is_dir()}
    except (zipfile.BadZipFile, OSError) as e:
        raise InspectError(f"{wheel.name} is not a readable wheel: {e}") from e


def check_wheel_file(wheel: Path) -> None:
    """A file given as a wheel is one: a wheel's file name, and a zip that opens with a ``*.dist-info/WHEEL``
    inside. Checked before the name is used to find a recipe, so that a zip or a truncated wheel says what it is."""
    hint = "give a .whl file (a wheel this tool built), or a package name"
    try:
        parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as e:
        raise InspectError(f"{wheel}: not a wheel: {e}", hint) from e
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise InspectError(f"{wheel}: not a wheel: not a readable zip ({e})", hint) from e
    if not any(n.count("/") == 1 and n.endswith(".dist-info/WHEEL") for n in names):
        raise InspectError(f"{wheel}: not a wheel: a zip without a .dist-info/WHEEL file", hint)


def modes(wheel: Path) -> dict[str, int]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: (info.external_attr >> 16) & 0o777 for info in zf.infolist()}


def dist_info_dir(entries: dict[str, bytes], wheel_name: str) -> str:
    dirs = {name.split("/", 1)[0] for name in entries if name.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise InspectError(f"{wheel_name}: expected one .dist-info folder, found {sorted(dirs) or 'none'}")
    return dirs.pop()


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path: Path, entries: dict[str, bytes], dist_info: str, file_modes: dict[str, int]) -> None:
    """Write entries (RECORD regenerated, dist-info last, sorted) with SOURCE_DATE_EPOCH timestamps."""
    record_name = f"{dist_info}/RECORD"
    body = {k: v for k, v in entries.items() if k != record_name}
    ordered = sorted(k for k in body if not k.startswith(f"{dist_info}/")) + sorted(
        k for k in body if k.startswith(f"{dist_info}/")
    )
    record = "\n".join([*(record_line(k, body[k]) for k in ordered), f"{record_name},,"]) + "\n"
    epoch = max(EPOCH_MIN, int(os.environ.get("SOURCE_DATE_EPOCH", EPOCH_MIN)))
    stamp = time.gmtime(epoch)[:6]
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in [*ordered, record_name]:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100000 | file_modes.get(name, 0o644)) << 16
            zf.writestr(info, record.encode() if name == record_name else body[name])
    tmp.replace(path)


def tag_part(wheel_name: str) -> str:
    """``py-abi-platform`` of a wheel file name (validated by packaging)."""
    parse_wheel_filename(wheel_name)
    return "-".join(wheel_name[: -len(".whl")].split("-")[-3:])
