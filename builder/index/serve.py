"""`builder serve`: the wheelhouse over HTTP, with PEP 691 content negotiation.

Standard library only (``http.server`` handlers behind builder/index/connections.py). Index folders (``simple/``,
``simple/<project>/``, ``channels/<label>/simple/...``) hold both ``index.html`` and ``index.json``; the ``Accept``
header (or PyPI's ``?format=`` query parameter) picks one:

    application/vnd.pypi.simple.v1+json    → index.json
    application/vnd.pypi.simple.v1+html    → index.html
    text/html, */*, no header              → index.html (served as text/html)
    anything else                          → 406 Not Acceptable

Every response to an index folder says ``Vary: Accept``. Dot-files (the lock, temp files) are never served, nor
a file whose real path (the opened file's, read back from /proc) leaves the wheelhouse, nor one with more than one
hard link (publication copies files, never links them, so a second name can only be someone's link from elsewhere),
nor anything but a regular file (a fifo would block). Files answer ``Range: bytes=a-b | a- | -n`` with 206 and
``Content-Range`` (416 when it starts past the end; several ranges get the whole file, 200). Every request is answered
(400 for a NUL byte, 414 for a path over 4096 bytes or a segment over 255, 404, 406, 416), never a dropped
connection; the connection layer (builder/index/connections.py) bounds slow clients in time and number. A file
body over ``Limits.small_body`` takes one of ``Limits.bodies`` slots; when none is free the request is answered 503
with ``Retry-After: 1`` (pages and small files are always sent), so downloads leave room for new clients.
Requests are logged one per line (``"GET /path HTTP/1.1" 200``) to stderr or a given stream.
"""

from __future__ import annotations

import datetime
import email.utils
import html
import io
import os
import posixpath
import re
import shutil
import socket
import stat
import sys
import urllib.parse
from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path
from typing import IO, BinaryIO, cast

from packaging.utils import canonicalize_name

from builder.index.connections import Body, Limits, PooledHTTPServer, Request, SocketWriter
from builder.index.httpheaders import UNSATISFIABLE, byte_range, negotiate
from builder.index.layout import GENERATIONS, PAGE_HTML, PAGE_JSON, SIMPLE, STAGING
from builder.index.pages import SIMPLE_HTML, SIMPLE_JSON

MAX_PATH = 4096  # a longer request path is answered 414
MAX_SEGMENT = 255  # a longer path segment cannot name a file (NAME_MAX): 414
_DIGITS = re.compile(r"[0-9]+")


def _inside(real: str, root: str) -> bool:
    """Whether ``real`` (a resolved path) lies in the wheelhouse ``root`` (resolved) through no dot-name but a page
    generation, ``[staging/].generations/<N>/`` (where the links ``simple`` and ``channels`` lead): so a link can
    reach neither the lock, a journal, a temp file, nor anything outside."""
    relative = os.path.relpath(real, root)
    if relative == os.curdir:
        return True
    parts = relative.split(os.sep)
    if parts[0] == os.pardir:
        return False
    at = 1 if parts[0] == STAGING else 0
    if parts[at:at + 1] == [GENERATIONS] and len(parts) > at + 1 and _DIGITS.fullmatch(parts[at + 1]):
        parts = parts[at + 2:]
    return not any(p.startswith(".") for p in parts)


def _real_path(fd: int, path: Path) -> str:
    """The real path of an open file: read back from /proc (what was opened, whatever was swapped since), else the
    path resolved. A file replaced after the open reads ``… (deleted)``: the path it had is what counts."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    return real.removesuffix(" (deleted)")


class IndexHandler(SimpleHTTPRequestHandler):
    server_version = "cuda-wheel-builder"
    protocol_version = "HTTP/1.1"  # keep-alive: a resolver fetches many pages
    extensions_map = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".whl": "application/octet-stream",
        ".metadata": "text/plain; charset=utf-8",
        ".log": "text/plain; charset=utf-8",
        ".json": "application/json",
    }

    def __init__(self, *args, log_stream: IO[str] | None = None, **kwargs) -> None:
        self.log_stream = log_stream
        self.body: tuple[int, int] | None = None  # (offset, length) of a file body still to send
        self.body_out: Body | None = None  # that body, for the connection loop to send
        self.slot: Callable[[], None] | None = None  # gives back the body slot this answer took
        super().__init__(*args, **kwargs)

    # one request per handler: the connection layer reads the head and keeps the connection between requests

    def setup(self) -> None:
        request: Request = self.request
        self.connection = request.sock
        self.rfile = io.BytesIO(request.data)
        self.wfile = SocketWriter(request.sock)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        headers = getattr(self, "headers", None)
        if headers is not None and (headers.get("Content-Length", "0").strip() not in ("", "0")
                                    or "Transfer-Encoding" in headers):
            self.close_connection = True  # a body this server does not read: the next head cannot be found

    def finish(self) -> None:
        self.leftover = self.rfile.read()  # pipelined bytes: the next request's, for the connection layer
        if self.slot is not None and self.body_out is None:  # a slot taken for a body that was never handed on
            slot, self.slot = self.slot, None
            slot()
        super().finish()

    # answers

    def send_head(self):
        try:
            return self._send_head()
        except (OSError, ValueError, RuntimeError) as e:  # an odd path the checks below did not foresee
            self.send_error(HTTPStatus.BAD_REQUEST, "Bad Request", f"cannot serve this path ({type(e).__name__})")
            return None

    def _send_head(self):
        """Every request gets an answer: 414 for an over-long path or segment, 400 for a NUL byte, 404 for a
        dot-file or anything that resolves (through symlinks) outside the wheelhouse."""
        parsed = urllib.parse.urlsplit(self.path)
        decoded = urllib.parse.unquote(parsed.path)
        if len(self.path) > MAX_PATH or any(len(seg.encode()) > MAX_SEGMENT for seg in decoded.split("/")):
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG, "URI Too Long")
            return None
        if "\0" in decoded or "\0" in urllib.parse.unquote(parsed.query):
            self.send_error(HTTPStatus.BAD_REQUEST, "Bad Request", "the path holds a NUL byte")
            return None
        parts = [p for p in posixpath.normpath(decoded).split("/") if p]
        if any(p.startswith(".") for p in parts):
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        fs_path = Path(self.translate_path(self.path))
        try:
            confined = self._confined(fs_path)
        except (OSError, ValueError, RuntimeError):
            confined = False
        if not confined:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        if not fs_path.exists() and self._redirect_to_normalized(parts, parsed):
            return None
        if not fs_path.is_dir():
            if parsed.path.endswith("/"):  # a file named as a folder
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            return self._send_file(fs_path, self.guess_type(fs_path))
        if not parsed.path.endswith("/"):  # a folder: its pages' relative links need the slash
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", urllib.parse.urlunsplit(
                ("", "", parsed.path + "/", parsed.query, "")))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if (fs_path / PAGE_JSON).is_file() and (fs_path / PAGE_HTML).is_file():
            query = urllib.parse.parse_qs(parsed.query).get("format", [None])[0]
            query = query.replace(" ", "+") if query else None  # an unencoded "+json" reads as " json"
            chosen = negotiate(self.headers.get("Accept"), query)
            if chosen is None:
                self.send_error(HTTPStatus.NOT_ACCEPTABLE, "Not Acceptable",
                                f"this index serves {SIMPLE_JSON}, {SIMPLE_HTML} and text/html")
                return None
            page = fs_path / (PAGE_JSON if chosen == SIMPLE_JSON else PAGE_HTML)
            return self._send_file(page, chosen if chosen != "text/html" else "text/html; charset=utf-8",
                                   negotiated=True)
        if (fs_path / PAGE_HTML).is_file():  # the dashboard
            return self._send_file(fs_path / PAGE_HTML, "text/html; charset=utf-8")
        return self.list_directory(str(fs_path))

    def _confined(self, fs_path: Path) -> bool:
        """Whether the path, symlinks resolved, stays inside the served folder and names no dot-file there."""
        if not fs_path.exists() and not fs_path.is_symlink():
            return True  # nothing there: the normal 404 (or a PEP 503 redirect) follows
        return _inside(str(fs_path.resolve(strict=True)), os.path.realpath(self.directory))

    def _open_served(self, path: Path) -> tuple[BinaryIO, os.stat_result] | None:
        """The file opened, or None (logged) when it must not be served. The checks look at what was opened, so a
        link swapped in between a check and the open cannot slip through."""
        try:  # non-blocking: opening a fifo for reading would wait for a writer
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            refusal = None
            if not stat.S_ISREG(st.st_mode):
                refusal = "not a regular file"
            elif st.st_nlink > 1:  # publication copies files; a second name may lie anywhere on this file system
                refusal = f"{st.st_nlink} hard links to it (a copy is served, a link is not)"
            elif not _inside(_real_path(fd, path), os.path.realpath(self.directory)):
                refusal = "its real path leaves the wheelhouse"
            if refusal:
                self.log_message("refused %s: %s", path.relative_to(self.directory)
                                 if path.is_relative_to(self.directory) else path, refusal)
                os.close(fd)
                return None
            os.set_blocking(fd, True)
            return open(fd, "rb"), st
        except BaseException:
            os.close(fd)
            raise

    def _send_file(self, path: Path, content_type: str, negotiated: bool = False):
        """200 with the file, 206 with the part a ``Range`` asks (416 past the end), or 304 when unchanged since
        ``If-Modified-Since``; index pages negotiated on ``Accept`` say ``Vary: Accept``."""
        opened = self._open_served(path)
        if opened is None:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        f, st = opened
        last_modified = self.date_time_string(st.st_mtime)
        span = byte_range(self.headers.get("Range"), st.st_size) if self._if_range_holds(last_modified) else None
        if span is None and self._not_modified(st.st_mtime):
            status = HTTPStatus.NOT_MODIFIED
        elif span == UNSATISFIABLE:
            status = HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
        else:
            status = HTTPStatus.PARTIAL_CONTENT if span else HTTPStatus.OK
        first, last = span if isinstance(span, tuple) else (0, st.st_size - 1)
        if status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT) and not self._body_slot(last - first + 1):
            f.close()
            return None
        self.send_response(status)
        if status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(last - first + 1))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {first}-{last}/{st.st_size}")
        if status == HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE:
            self.send_header("Content-Range", f"bytes */{st.st_size}")
            self.send_header("Content-Length", "0")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", last_modified)
        if negotiated:
            self.send_header("Vary", "Accept")
            self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if status not in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            f.close()
            return None
        self.body = (first, last - first + 1)
        return f

    def _body_slot(self, length: int) -> bool:
        """Whether a body of ``length`` bytes may be sent now; False when it answered 503 (every slot for a large
        body is taken: the downloads in flight must not hold every connection)."""
        server = self.server
        if not isinstance(server, PooledHTTPServer) or length <= server.limits.small_body:
            return True
        if server.take_body_slot():
            self.slot = server.give_body_slot
            return True
        body = b"503 Service Unavailable: too many downloads at once, retry in a second\n"
        self.send_response(HTTPStatus.SERVICE_UNAVAILABLE)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True
        return False

    def _if_range_holds(self, last_modified: str) -> bool:
        """``If-Range``: the range applies only while the file is the one the client saw (its date; there is no
        ETag here, so an entity tag never matches and the whole file is sent)."""
        condition = self.headers.get("If-Range")
        return condition is None or condition.strip() == last_modified

    def _not_modified(self, mtime: float) -> bool:
        since = self.headers.get("If-Modified-Since")
        if since is None or "If-None-Match" in self.headers:
            return False
        try:
            when = email.utils.parsedate_to_datetime(since)
        except (TypeError, IndexError, OverflowError, ValueError):
            return False
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return datetime.datetime.fromtimestamp(int(mtime), datetime.UTC) <= when

    def copyfile(self, source, outputfile) -> None:
        """A file body is left to the connection loop (``body_out``: it sends it with sendfile(2) as the client
        reads, without holding this worker); a listing or an error page is written at once."""
        if self.body is None:
            shutil.copyfileobj(source, outputfile)
            return
        offset, length = self.body
        self.body = None
        if length > 0:
            slot, self.slot = self.slot, None
            self.body_out = Body(os.dup(source.fileno()), offset, length, release=slot)

    def _redirect_to_normalized(self, parts: list[str], parsed: urllib.parse.SplitResult) -> bool:
        """PEP 503: ``/simple/Causal_Conv1D/`` → 301 to ``/simple/causal-conv1d/``."""
        try:
            at = len(parts) - 1 - parts[::-1].index(SIMPLE)
        except ValueError:
            return False
        if at + 1 >= len(parts):
            return False
        normalized = str(canonicalize_name(parts[at + 1]))
        if normalized == parts[at + 1]:
            return False
        target = "/" + "/".join([*parts[: at + 1], normalized, *parts[at + 2:]]) + "/"
        if not Path(self.translate_path(target)).is_dir():
            return False
        self.send_response(HTTPStatus.MOVED_PERMANENTLY)
        self.send_header("Location", target + (f"?{parsed.query}" if parsed.query else ""))
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def list_directory(self, path):
        """Folder listings without dot-files (the lock, temp files of a publish in progress) or anything
        `_open_served` would refuse."""
        try:
            names = sorted(n for n in os.listdir(path) if not n.startswith(".") and self._listable(Path(path) / n))
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "No permission to list directory")
            return None
        shown = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        items = []
        for name in names:
            suffix = "/" if os.path.isdir(os.path.join(path, name)) else ""
            items.append(f'<li><a href="{urllib.parse.quote(name + suffix)}">{html.escape(name + suffix)}</a></li>')
        body = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(shown)}</title></head>"
                f"<body><h1>{html.escape(shown)}</h1><ul>{''.join(items)}</ul></body></html>\n").encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def _listable(self, path: Path) -> bool:
        try:
            st = path.stat()
            return self._confined(path) and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
        except (OSError, ValueError, RuntimeError):
            return False

    def log_message(self, format: str, *args: object) -> None:
        stream = self.log_stream or sys.stderr
        stream.write(f"{self.address_string()} - [{self.log_date_time_string()}] {format % args}\n")
        stream.flush()


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8000, log_stream: IO[str] | None = None,
                limits: Limits | None = None) -> HTTPServer:
    """A server for ``root`` (not yet serving: call ``serve_forever``); port 0 picks a free port."""

    def log(line: str) -> None:
        stream = log_stream or sys.stderr
        stream.write(f"{line}\n")
        stream.flush()

    handler = partial(IndexHandler, directory=str(root), log_stream=log_stream)
    server_class = PooledHTTPServer
    if ":" in host:  # an IPv6 address such as ::1 or ::
        server_class = cast(type[PooledHTTPServer],  # a subclass, by construction
                            type("PooledHTTPServerV6", (PooledHTTPServer,), {"address_family": socket.AF_INET6}))
    return server_class((host, port), handler, limits or Limits(), log)


def base_url(server: HTTPServer) -> str:
    address, port = server.server_address[:2]
    host = str(address)  # a str for an AF_INET/AF_INET6 server
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
