"""What the wheelhouse checks before it trusts a file: a wheel's METADATA against its name, a record against the
wheel's bytes, a build log against the builder's own naming."""

from __future__ import annotations

import json
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError, PublishError
from builder.core.wheelfile import dist_info_dir, parse_wheel_name
from builder.index.layout import Layout
from builder.model.records import BuildRecord


def check_wheel(wheel: Path, filename: str | None = None) -> bytes:
    """The wheel's METADATA bytes, after checking that its Name and Version agree with the file name (``filename``
    when the bytes are in a temp file)."""
    shown = filename or wheel.name
    try:
        name, version, _, _ = parse_wheel_name(shown)
    except InvalidWheelFilename as e:
        raise PublishError(f"refusing to publish {shown}: not a valid wheel file name ({e})") from e
    try:
        with zipfile.ZipFile(wheel) as zf:  # read METADATA alone: wheels can be hundreds of MB
            names = {info.filename: b"" for info in zf.infolist() if not info.is_dir()}
            data = zf.read(f"{dist_info_dir(names, shown)}/METADATA")
    except KeyError:
        raise PublishError(f"refusing to publish {shown}: it has no .dist-info/METADATA") from None
    except BuilderError as e:
        raise PublishError(f"refusing to publish {shown}: {e.message}") from e
    except (zipfile.BadZipFile, OSError) as e:
        raise PublishError(f"refusing to publish {shown}: not a readable wheel ({e})") from e
    headers = HeaderParser().parsestr(data.decode("utf-8", "replace"))
    meta_name, meta_version = headers.get("Name"), headers.get("Version")
    try:
        parsed = Version(meta_version or "")
    except InvalidVersion:
        parsed = None
    if parsed != version:
        raise PublishError(
            f"refusing to publish {shown}: its METADATA says Version: {meta_version} "
            f"but the file name says {version}",
            "rebuild it so that both agree (finalize_wheel rewrites the name and METADATA together)",
        )
    if canonicalize_name(meta_name or "") != canonicalize_name(name):
        raise PublishError(
            f"refusing to publish {shown}: its METADATA says Name: {meta_name} but the file name says {name}",
            "rebuild it so that both agree",
        )
    return data


def record_mismatch(wheel: Path, record: BuildRecord, digest: str) -> str | None:
    """Why ``record`` does not describe the bytes of ``wheel`` (None when it does)."""
    expected = record.wheel_sha256
    if expected is not None:
        return None if expected == digest else f"the wheel's sha256 is {digest}, the record says {expected}"
    try:  # a record from before wheel_sha256: the cache key finalize wrote into the wheel itself
        with zipfile.ZipFile(wheel) as zf:
            inner = next((n for n in zf.namelist() if n.endswith(".dist-info/cuda_wheel_builder.json")), None)
            embedded = json.loads(zf.read(inner)) if inner else None
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"the wheel is unreadable ({e})"
    if isinstance(embedded, dict) and embedded.get("cache_key") not in (None, record.cache_key):
        return "the wheel was built from other inputs than its record says"
    return None


def log_source(wheel: Path, record: BuildRecord | None) -> Path | None:
    """The build log to copy in: the record's build_log, else the copy in the wheelhouse the wheel comes from."""
    build_log = record.build_log if record is not None else ""
    if build_log and Path(build_log).is_file():
        return Path(build_log)
    beside = Layout.holding(wheel).log_file(wheel.name)
    return beside if beside.is_file() else None


def own_log(source: Path, paths: Layout, record: BuildRecord | None) -> bool:
    """Only a log of the builder's own naming is copied in: ``<package>-<version>-<key[:12]>.log`` in a folder
    named logs (the cache's, core/cachedir.py), or the copy in a wheelhouse's logs/. A record naming /etc/passwd as
    its build_log, or a symlink out of the folder, gets no copy."""
    try:
        resolved = source.resolve(strict=True)
    except OSError:
        return False
    if not resolved.is_file():
        return False
    if source.parent.resolve() == paths.logs.resolve() == resolved.parent:
        return True
    if record is None:
        return False
    key = record.cache_key
    expected = f"{record.package}-{record.version}-{key[:12]}.log"
    return bool(key) and resolved.parent.name == "logs" and resolved.name == expected == source.name
