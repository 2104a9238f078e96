"""Reading and rewriting wheels: entries sorted, timestamps fixed, RECORD regenerated (reproducible output)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import BuildTag, InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

from builder.core.errors import InspectError, UsageError

EPOCH_MIN = 315532800  # 1980-01-01, the earliest time a zip can hold
EPOCH_MAX = 4354819198  # 2107-12-31 23:59:58, the latest (a zip's year is 1980 + 7 bits)
LABEL = re.compile(r"^[0-9a-z._]{1,16}$")  # a wheel variant's label (PEP 825)


def split_label(filename: str) -> tuple[str, str | None]:
    """``x-1.0-cp310-abi3-linux_x86_64-sm120.whl`` → (``x-1.0-cp310-abi3-linux_x86_64.whl``, ``sm120``): a
    variant wheel's (PEP 825) plain name and label; a plain wheel's name comes back as it is, with None. Six parts
    are a build tag when the third starts with a digit (the wheel spec's rule), else a label; seven are both."""
    if not filename.endswith(".whl"):
        return filename, None
    parts = filename[:-4].split("-")
    if (len(parts) == 7 or (len(parts) == 6 and not parts[2][:1].isdigit())) and LABEL.match(parts[-1]):
        return "-".join(parts[:-1]) + ".whl", parts[-1]
    return filename, None


def parse_wheel_name(filename: str) -> tuple[NormalizedName, Version, BuildTag, frozenset[Tag]]:
    """packaging's ``parse_wheel_filename``, for variant wheels too (their label set aside)."""
    return parse_wheel_filename(split_label(filename)[0])


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
        parse_wheel_name(wheel.name)
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
    epoch = source_date_epoch(os.environ)
    stamp = time.gmtime(epoch)[:6]
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in [*ordered, record_name]:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100000 | file_modes.get(name, 0o644)) << 16
            zf.writestr(info, record.encode() if name == record_name else body[name])
    tmp.replace(path)


def source_date_epoch(environ: Mapping[str, str]) -> int:
    """The wheels' timestamp from SOURCE_DATE_EPOCH (reproducible-builds.org): unset or empty (common in CI) is
    1980-01-01, as is anything earlier; a value that is not a whole number of seconds, or lies past what a zip can
    hold (2107), is a UsageError naming it."""
    text = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not text:
        return EPOCH_MIN
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 20:
        raise UsageError(f"SOURCE_DATE_EPOCH={text[:40]!r}: not a whole number of seconds since 1970",
                         "set it to an integer such as $(git log -1 --format=%ct), or leave it empty or unset")
    epoch = int(text)
    if epoch > EPOCH_MAX:
        raise UsageError(f"SOURCE_DATE_EPOCH={text}: after 2107-12-31, the latest date a wheel (a zip) can hold",
                         "set it to a time before 2108, such as $(git log -1 --format=%ct), or leave it unset")
    return max(EPOCH_MIN, epoch)


def tag_part(wheel_name: str) -> str:
    """``py-abi-platform`` of a (plain or variant) wheel file name (validated by packaging)."""
    plain = split_label(wheel_name)[0]
    parse_wheel_filename(plain)
    return "-".join(plain[: -len(".whl")].split("-")[-3:])


# ------------------------------------------------------------------------------ build tags (superseded builds)


def build_number(filename: str) -> int:
    """The wheel build number of a (plain or variant) wheel file name: its PEP 427 build tag's number (``1`` of
    ``x-1.0+cu13-1-cp310-abi3-linux_x86_64.whl``), 0 without one (every wheel built before build tags)."""
    tag = parse_wheel_name(filename)[2]
    return tag[0] if tag else 0


def without_build(filename: str) -> str:
    """The file name with its build tag taken out: the name every build of the same wheel shares (a variant's
    label kept)."""
    plain, label = split_label(filename)
    if not parse_wheel_filename(plain)[2]:
        return filename
    parts = plain[:-4].split("-")
    name = "-".join([*parts[:2], *parts[3:]]) + ".whl"
    return name if label is None else f"{name[:-4]}-{label}.whl"


def with_build(filename: str, build: int) -> str:
    """``x-1.0-cp310-abi3-linux_x86_64.whl`` with build 1 → ``x-1.0-1-cp310-abi3-linux_x86_64.whl``; build 0:
    no build tag (the name a wheel had before build tags)."""
    plain, label = split_label(without_build(filename))
    parts = plain[:-4].split("-")
    name = "-".join([*parts[:2], *([str(build)] if build else []), *parts[2:]]) + ".whl"
    parse_wheel_filename(name)
    return name if label is None else f"{name[:-4]}-{label}.whl"


def superseded(filenames: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Which of ``filenames`` a newer build of the same wheel (same name, version, tags and variant label; a
    higher build number) supersedes: each such file → the newest build's file name."""
    newest: dict[str, str] = {}
    for filename in filenames:
        key = without_build(filename)
        if key not in newest or build_number(filename) > build_number(newest[key]):
            newest[key] = filename
    return {f: newest[without_build(f)] for f in filenames
            if build_number(f) < build_number(newest[without_build(f)])}


def set_wheel_build(text: str, build: int) -> str:
    """A ``.dist-info/WHEEL`` file's text with its ``Build:`` line set to ``build`` (removed for 0): the wheel spec
    wants it to match the file name's build tag."""
    lines = [line for line in text.splitlines() if not line.startswith("Build:")]
    if build:
        lines.append(f"Build: {build}")
    return "\n".join(lines) + "\n"
