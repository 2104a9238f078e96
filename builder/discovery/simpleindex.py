"""The simple-index reader: a project's wheel files from a PEP 691 JSON or PEP 503 HTML page (remote or
``file://``), and one wheel's METADATA without downloading the wheel (PEP 658, else HTTP range reads)."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.parse
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder.core import net

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    metadata: bool | None  # PEP 658/714: True served, False not, None the index did not say
    uploaded: str = ""  # PEP 700 upload-time (JSON pages only)
    sha256: str = ""  # the page's hash of the file ("" where it gives none)



class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.files.append(dict(attrs))


def _get(url: str, accept: str | None = None, byte_range: str | None = None) -> tuple[bytes, str]:
    """The body and Content-Type at ``url``, under the network policy (core/net.py)."""
    headers = {}
    if accept:
        headers["Accept"] = accept
    if byte_range:
        headers["Range"] = byte_range

    def read(response: net.Body) -> tuple[bytes, str]:
        if byte_range and response.status != 206:  # a server that ignores Range would send the whole wheel
            raise OSError(f"{url}: the server ignored the range request")
        return response.read(), response.headers.get("Content-Type", "") or ""

    return net.open_url(url, read, headers=headers)


def project_files(index_url: str, project: str = "torch") -> list[WheelFile]:
    """The wheel files of ``project`` on a simple index (PEP 691 JSON, else PEP 503 HTML; yanked left out)."""
    page = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    if page.startswith("file://"):
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(page).path))
        json_page = local / "index.json"
        body, kind = (json_page.read_bytes(), "json") if json_page.exists() else ((local / "index.html").read_bytes(), "html")
    else:
        body, kind = _get(page, ACCEPT)
    files: list[WheelFile] = []
    if "json" in kind:
        for f in json.loads(body).get("files", []):
            if f.get("yanked") or not f["filename"].endswith(".whl"):
                continue
            meta = f.get("core-metadata", f.get("dist-info-metadata"))
            hashes = f.get("hashes")
            files.append(WheelFile(f["filename"], urllib.parse.urljoin(page, f["url"]),
                                   None if meta is None else bool(meta), str(f.get("upload-time") or ""),
                                   str(hashes.get("sha256", "")) if isinstance(hashes, dict) else ""))
        return files
    parser = _Anchors()
    parser.feed(body.decode(errors="replace"))
    for attrs in parser.files:
        href = attrs.get("href") or ""
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not name.endswith(".whl") or "data-yanked" in attrs:
            continue
        # PEP 714/658: the attribute's presence (any value but "false") says a .metadata file is served
        said = "data-core-metadata" in attrs or "data-dist-info-metadata" in attrs
        meta = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else ""
        files.append(WheelFile(name, url, meta != "false" if said else None, sha256=sha256))
    return files


class _Seekable(io.RawIOBase):
    """A read-only file of ``size`` bytes whose position is tracked here (subclasses implement read)."""

    size: int
    pos: int

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos


class _RangeReader(_Seekable):
    """A seekable read-only view of a remote file through HTTP range requests (for zipfile)."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos, self.requests = url, size, 0, 0

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        self.requests += 1
        if self.requests > 16:
            raise OSError(f"{self.url}: too many range requests")
        body, _ = _get(self.url, byte_range=f"bytes={self.pos}-{end - 1}")
        self.pos += len(body)
        return body


def _remote_size(url: str) -> int:
    def size(response: net.Body) -> int:
        if response.headers.get("Accept-Ranges", "").lower() != "bytes":
            raise OSError(f"{url}: no range requests")
        return int(response.headers["Content-Length"])

    return net.open_url(url, size, method="HEAD")


def _metadata_from_zip(file: Any, filename: str) -> str:
    with zipfile.ZipFile(file) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            raise zipfile.BadZipFile("no .dist-info/METADATA member")
        return archive.read(name).decode()


def wheel_metadata(wheel: WheelFile) -> tuple[str, str]:
    """(METADATA text, how it was read) of one wheel, never downloading the wheel."""
    if wheel.url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(wheel.url).path))
        sidecar = path.with_name(path.name + ".metadata")
        if sidecar.exists():
            return sidecar.read_text(), "PEP 658"
        return _metadata_from_zip(path, wheel.filename), "local wheel"
    if wheel.metadata is not False:
        try:
            return _get(wheel.url + ".metadata")[0].decode(), "PEP 658"
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
    return _metadata_from_zip(_remote_zip(wheel.url), wheel.filename), "range read of the wheel's METADATA"


def wheel_member(wheel: WheelFile, name: str) -> str:
    """The text of member ``name`` (``torch/version.py``) of one wheel, read with range requests (a remote wheel's
    central directory and that member, never the whole file) or from the local file."""
    if wheel.url.startswith("file://"):
        source: Any = Path(urllib.parse.unquote(urllib.parse.urlparse(wheel.url).path))
    else:
        source = _remote_zip(wheel.url)
    with zipfile.ZipFile(source) as archive:
        return archive.read(name).decode()


def _remote_zip(url: str) -> _TailBuffer:
    """A remote zip as a seekable file that reads its tail (the central directory) once and the rest on demand."""
    reader = _RangeReader(url, _remote_size(url))
    # The last 64 KB hold the end-of-central-directory record; it says where the central directory starts, which
    # is then read in one request (a torch wheel's is about 1-2 MB); zipfile then reads the one member.
    tail_size = min(reader.size, 64 * 1024)
    reader.seek(reader.size - tail_size)
    tail = reader.read(tail_size)
    start = reader.size - tail_size
    at = tail.rfind(b"PK\x05\x06")
    if at >= 0 and len(tail) >= at + 22:
        cd_offset = int.from_bytes(tail[at + 16:at + 20], "little")
        if cd_offset != 0xFFFFFFFF and cd_offset < start:  # (zip64: read on demand instead)
            reader.seek(cd_offset)
            tail = reader.read(start - cd_offset) + tail
            start = cd_offset
    buffered = _TailBuffer(reader, tail, start)
    return buffered



class _TailBuffer(_Seekable):
    """The last bytes of a remote file held in memory; reads before them go to the range reader."""

    def __init__(self, reader: _RangeReader, tail: bytes, start: int) -> None:
        self.reader, self.tail, self.start, self.pos, self.size = reader, tail, start, 0, reader.size

    def read(self, n: int = -1) -> bytes:
        end = self.reader.size if n < 0 else min(self.reader.size, self.pos + n)
        if self.pos >= self.start:
            data = self.tail[self.pos - self.start:end - self.start]
        else:
            self.reader.seek(self.pos)
            data = self.reader.read(end - self.pos)
        self.pos += len(data)
        return data
