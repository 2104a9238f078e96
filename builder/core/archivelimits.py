"""Archive extraction's bounds and the member-name checks a tar and a zip share (core/safetar.py and
core/safezip.py read the limits from here at call time, so a test may lower one)."""

from __future__ import annotations

from pathlib import Path

from builder.core.errors import SourceError

# Every bound below holds for the whole archive and is checked while it is read, before anything is written: a
# hostile archive is refused in seconds and in tens of MB however it is built (issue 30 measured 3000 GNU long-name
# headers at 3 GB RSS and 600 s, 100 000 members at 429 s).

MAX_UNPACKED_BYTES = 2 * 1024**3  # a decompression bomb stops here
MAX_MEMBERS = 100_000
MAX_HEADER_BYTES = 1024 * 1024  # one GNU long-name / long-link or pax header
MAX_HEADER_TOTAL = 16 * 1024 * 1024  # all of them together
MAX_NAME_BYTES = 2048  # a member's path; the work folder's path must fit beside it in PATH_MAX (4096)
MAX_NAME_DEPTH = 256  # folders in one member's path (os.makedirs recurses once for each)
MAX_COMPONENT_BYTES = 255  # one file name (NAME_MAX)
MAX_LINK_STEPS = 4_000_000  # path components followed through the archive's own symlinks, in all


def short(text: str, limit: int = 80) -> str:
    """A member name as an error line quotes it: a 1 MiB name is not printed whole."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text.encode(errors='replace'))} bytes)"


def member_parts(path: str) -> tuple[str, ...]:
    """A member's path as extraction lays it out (empty and ``.`` parts dropped, as PurePosixPath does)."""
    return tuple(p for p in path.split("/") if p and p != ".")


def check_member_name(archive: Path, name: str, *, is_dir: bool = False) -> tuple[str, ...]:
    """Refuse names that are empty, too long or deep, absolute or climbing out; returns the name's parts."""
    if not name.strip() or "\0" in name:
        raise SourceError(f"{archive.name}: a member has an empty name ({short(name)}); archive refused")
    check_path_shape(archive, name, "member")
    parts = member_parts(name)
    if name.startswith(("/", "\\")) or (parts and ":" in parts[0]):
        raise SourceError(f"{archive.name}: member {short(name)} has an absolute path; archive refused")
    if ".." in parts:
        raise SourceError(f"{archive.name}: member {short(name)} climbs out with '..'; archive refused")
    if not parts and not is_dir:  # "." or "./": only a directory may be the top itself
        raise SourceError(f"{archive.name}: member {short(name)} is not a directory but names the top folder; "
                          "refused")
    return parts


def check_path_shape(archive: Path, path: str, what: str) -> None:
    """Paths the file system takes: bounded length and depth (a 5000-folder name overflows os.makedirs' recursion),
    no file name over NAME_MAX."""
    if len(path) < 64:
        return  # the common case: at most 252 bytes, 32 folders
    size = len(path.encode(errors="surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise SourceError(f"{archive.name}: {what} {short(path)} is longer than {MAX_NAME_BYTES} bytes; "
                          "archive refused")
    parts = path.split("/")
    if len(parts) > MAX_NAME_DEPTH:
        raise SourceError(f"{archive.name}: {what} {short(path)} is {len(parts)} folders deep (more than "
                          f"{MAX_NAME_DEPTH}); archive refused")
    longest = max(parts, key=lambda p: len(p.encode(errors="surrogateescape")))
    if len(longest.encode(errors="surrogateescape")) > MAX_COMPONENT_BYTES:
        raise SourceError(f"{archive.name}: {what} {short(path)} has a file name of "
                          f"{len(longest.encode(errors='surrogateescape'))} bytes (more than {MAX_COMPONENT_BYTES}); "
                          "archive refused")


def check_tree_shape(archive: Path, kinds: dict[tuple[str, ...], str]) -> None:
    """A file that is also a folder (``a`` a file, then ``a/b`` or a folder ``a``) fails half-way through the
    extraction; refuse it first. Sorted, a path's descendants follow it directly, so one pass finds every clash."""
    ordered = sorted(kinds)
    for path, after in zip(ordered, ordered[1:], strict=False):
        if kinds[path] == "file" and after[: len(path)] == path:
            raise SourceError(f"{archive.name}: {short('/'.join(path))} is a file, yet the archive also puts "
                              f"{short('/'.join(after))} under it; archive refused")


def add_kind(archive: Path, kinds: dict[tuple[str, ...], str], parts: tuple[str, ...], kind: str) -> None:
    """Record a member's path and kind ("dir", "file" or "link"); the same path as a file and as a folder clashes."""
    before = kinds.setdefault(parts, kind)
    if {before, kind} == {"dir", "file"}:
        raise SourceError(f"{archive.name}: {short('/'.join(parts))} is both a file and a folder; archive refused")
