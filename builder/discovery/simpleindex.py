"""The simple-index reader: a project's wheel files from a PEP 691 JSON or PEP 503 HTML page (remote or
``file://``), and one wheel's METADATA without downloading the wheel (PEP 658, else HTTP range reads).

Every read is bounded and shape-checked (issue 54): a page, a ``.metadata`` file, one range request and one
unpacked member have byte caps (``MAX_*``; net.TooLarge past them), a page at most ``MAX_FILES`` files, and a page
of the wrong shape (JSON that is not an object, ``files`` not a list, a file without ``filename``, nesting past
the parser) is a ``PageError`` naming the URL and what is wrong. A remote page's files must be http(s):// (a
``file://`` link on someone else's server would read this machine's files). All reads of one command share one
deadline (``READS``, started by the outermost ``reading()``): 200 releases with dripping METADATA cost the network
deadline once, not 200 times.
"""

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
from builder.core.errors import SourceError

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"

# PyPI's torch page (JSON) is about 2 MB and download.pytorch.org's largest (HTML) about 4 MB, with some 10 000 files.
MAX_PAGE_BYTES = 64 * 1024**2
MAX_FILES = 100_000  # files (anchors) on one page: a million anchors took 55 s and 651 MB
MAX_METADATA_BYTES = 8 * 1024**2  # torch's METADATA is about 30 KB
MAX_RANGE_BYTES = 16 * 1024**2  # one range request: a zip's central directory (torch's: 1-2 MB)
MAX_MEMBER_BYTES = 8 * 1024**2  # one unpacked member (METADATA, torch/version.py)
_PAGE_CURE = "check that the URL is a PEP 503/691 simple index (its project pages list wheel files)"

READS = net.Budget("torch-index reads")


def reading() -> net.BudgetScope:
    """``with reading():`` every index read inside (in any thread) shares one network deadline."""
    return READS.scope(net.current().deadline_s)


class PageError(SourceError, ValueError):
    """A page or file of the wrong shape or size. A SourceError for the CLI; a ValueError for the callers that fall
    back to a cached list when an index cannot be read."""


def _bad(url: str, what: str) -> PageError:
    return PageError(f"{url}: {what}; refused", _PAGE_CURE)


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


def _get(url: str, accept: str | None = None, byte_range: str | None = None, *,
         max_bytes: int | None = None) -> tuple[bytes, str]:
    """The body (at most ``max_bytes``, else MAX_PAGE_BYTES) and Content-Type at ``url``, under the network policy (core/net.py) and
    within the deadline the index reads share."""
    headers = {}
    if accept:
        headers["Accept"] = accept
    if byte_range:
        headers["Range"] = byte_range

    def read(response: net.Body) -> tuple[bytes, str]:
        if byte_range and response.status != 206:  # a server that ignores Range would send the whole wheel
            raise OSError(f"{url}: the server ignored the range request")
        return response.read(), response.headers.get("Content-Type", "") or ""

    try:
        return net.open_url(url, read, headers=headers, max_bytes=max_bytes or MAX_PAGE_BYTES, within=READS)
    except net.TooLarge as e:
        raise PageError(e.message, e.hint) from None


def project_files(index_url: str, project: str = "torch") -> list[WheelFile]:
    """The wheel files of ``project`` on a simple index (PEP 691 JSON, else PEP 503 HTML; yanked left out)."""
    page = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    if page.startswith("file://"):
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(page).path))
        json_page = local / "index.json"
        path, kind = (json_page, "json") if json_page.exists() else (local / "index.html", "html")
        body = _read_local(path, page)
    else:
        body, kind = _get(page, ACCEPT)
    files = _json_files(page, body) if "json" in kind else _html_files(page, body)
    if not page.startswith("file://"):
        for f in files:
            if urllib.parse.urlsplit(f.url).scheme.lower() not in ("http", "https"):
                raise _bad(page, f"file {f.filename!r} links {f.url[:120]!r}, which is not http(s)://")
    return files


def _read_local(path: Path, page: str) -> bytes:
    """A local page, at most MAX_PAGE_BYTES (a fifo or a folder is not read)."""
    if not path.is_file():
        raise FileNotFoundError(f"{page}: no {path.name} there (or not a plain file)")
    with path.open("rb") as f:
        body = f.read(MAX_PAGE_BYTES + 1)
    if len(body) > MAX_PAGE_BYTES:
        raise _bad(page, f"the page is more than {MAX_PAGE_BYTES} bytes")
    return body


def _json_files(page: str, body: bytes) -> list[WheelFile]:
    """The wheel files of a PEP 691 page, its shape checked (a JSON object whose ``files`` is a list of objects
    with a string ``filename`` and ``url``)."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise _bad(page, "the page's JSON is nested deeper than it can be read") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(page, f"the page is not JSON ({str(e)[:80]})") from None
    if not isinstance(data, dict):
        raise _bad(page, f"the page's JSON is {_kind(data)}, not an object (PEP 691)")
    entries = data.get("files", [])
    if not isinstance(entries, list):
        raise _bad(page, f"the page's 'files' is {_kind(entries)}, not a list")
    if len(entries) > MAX_FILES:
        raise _bad(page, f"the page lists {len(entries)} files, more than {MAX_FILES}")
    files: list[WheelFile] = []
    for n, f in enumerate(entries, 1):
        if not isinstance(f, dict):
            raise _bad(page, f"file {n} of the page is {_kind(f)}, not an object")
        filename, url = f.get("filename"), f.get("url")
        if not isinstance(filename, str) or not filename:
            raise _bad(page, f"file {n} of the page has no filename")
        if not isinstance(url, str) or not url:
            raise _bad(page, f"file {n} of the page ({filename[:80]!r}) has no url")
        if f.get("yanked") or not filename.endswith(".whl"):
            continue
        meta = f.get("core-metadata", f.get("dist-info-metadata"))
        hashes = f.get("hashes")
        uploaded = f.get("upload-time")
        files.append(WheelFile(filename, urllib.parse.urljoin(page, url), None if meta is None else bool(meta),
                               uploaded if isinstance(uploaded, str) else "",
                               str(hashes.get("sha256", "")) if isinstance(hashes, dict) else ""))
    return files


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
             bool: "true/false", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _html_files(page: str, body: bytes) -> list[WheelFile]:
    """The wheel files of a PEP 503 page, parsed a quarter MiB at a time and refused past MAX_FILES anchors."""
    parser = _Anchors()
    text = body.decode(errors="replace")
    step = 1 << 18  # a quarter MiB: a page past MAX_FILES stops within ~15 000 links of it
    for at in range(0, len(text), step):
        parser.feed(text[at:at + step])
        if len(parser.files) > MAX_FILES:
            raise _bad(page, f"the page has more than {MAX_FILES} links")
        if len(parser.rawdata) > step:  # one tag that never closes is read again with every chunk: refuse it
            raise _bad(page, f"the page has a tag longer than {step} bytes")
    parser.close()
    files: list[WheelFile] = []
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
        if end - self.pos > MAX_RANGE_BYTES:
            raise _bad(self.url, f"reading its METADATA would take {end - self.pos} bytes in one range request, "
                       f"more than {MAX_RANGE_BYTES}")
        body, _ = _get(self.url, byte_range=f"bytes={self.pos}-{end - 1}", max_bytes=end - self.pos)
        self.pos += len(body)
        return body


def _remote_size(url: str) -> int:
    def size(response: net.Body) -> int:
        if response.headers.get("Accept-Ranges", "").lower() != "bytes":
            raise OSError(f"{url}: no range requests")
        length = (response.headers.get("Content-Length") or "").strip()
        if not length.isdigit() or int(length) < 22:
            raise _bad(url, f"its Content-Length {length[:40]!r} is not the size of a zip")
        return int(length)

    return net.open_url(url, size, method="HEAD", within=READS)


def _metadata_from_zip(file: Any, filename: str) -> str:
    with zipfile.ZipFile(file) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            raise zipfile.BadZipFile("no .dist-info/METADATA member")
        return _member(archive, name, filename)


def _member(archive: zipfile.ZipFile, name: str, filename: str) -> str:
    """The text of one member, refused when it says it unpacks to more than MAX_MEMBER_BYTES (zipfile stops at
    the size it says)."""
    size = archive.getinfo(name).file_size
    if size > MAX_MEMBER_BYTES:
        raise _bad(filename, f"its {name} unpacks to {size} bytes, more than {MAX_MEMBER_BYTES}")
    return archive.read(name).decode()


def wheel_metadata(wheel: WheelFile) -> tuple[str, str]:
    """(METADATA text, how it was read) of one wheel, never downloading the wheel."""
    if wheel.url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(wheel.url).path))
        sidecar = path.with_name(path.name + ".metadata")
        if sidecar.is_file():
            with sidecar.open("rb") as f:
                text = f.read(MAX_METADATA_BYTES + 1)
            if len(text) > MAX_METADATA_BYTES:
                raise _bad(str(sidecar), f"it is more than {MAX_METADATA_BYTES} bytes")
            return text.decode(), "PEP 658"
        return _metadata_from_zip(path, wheel.filename), "local wheel"
    if wheel.metadata is not False:
        try:
            return _get(wheel.url + ".metadata", max_bytes=MAX_METADATA_BYTES)[0].decode(), "PEP 658"
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
        return _member(archive, name, wheel.filename)


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
