"""`builder serve`: the wheelhouse over HTTP, with PEP 691 content negotiation.

Standard library only (``http.server.ThreadingHTTPServer``). Index folders (``simple/``, ``simple/<project>/``,
``channels/<label>/simple/...``) hold both ``index.html`` and ``index.json``; the ``Accept`` header (or PyPI's
``?format=`` query parameter) picks one:

    application/vnd.pypi.simple.v1+json    → index.json
    application/vnd.pypi.simple.v1+html    → index.html
    text/html, */*, no header              → index.html (served as text/html)
    anything else                          → 406 Not Acceptable

Every response to an index folder says ``Vary: Accept``. Dot-files (the lock, temp files) are never served, nor
anything a symlink points to outside the wheelhouse; every request is answered (400 for a NUL byte, 414 for a path
over 4096 bytes or a segment over 255, 404, 406), never a dropped connection.
Requests are logged one per line (``"GET /path HTTP/1.1" 200``) to stderr or a given stream.
"""

from __future__ import annotations

import email.utils
import os
import posixpath
import sys
import urllib.parse
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, cast

from packaging.utils import canonicalize_name

from builder.index.layout import PAGE_HTML, PAGE_JSON, SIMPLE
from builder.index.pages import SIMPLE_HTML, SIMPLE_JSON

_LATEST_JSON = "application/vnd.pypi.simple.latest+json"
_LATEST_HTML = "application/vnd.pypi.simple.latest+html"
# What we can serve, in our order of preference when a client rates several equally.
_OFFERS = (SIMPLE_JSON, SIMPLE_HTML, "text/html")
MAX_PATH = 4096  # a longer request path is answered 414
MAX_SEGMENT = 255  # a longer path segment cannot name a file (NAME_MAX): 414


def negotiate(accept: str | None, query_format: str | None = None) -> str | None:
    """The content type to answer with, or None when nothing the client accepts can be served (406)."""
    if query_format:
        accept = query_format
    if not accept or not accept.strip():
        return "text/html"
    best: tuple[float, int, str] | None = None
    for part in accept.split(","):
        media, *params = [p.strip() for p in part.split(";")]
        media = media.lower()
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q <= 0:
            continue
        offered = {
            _LATEST_JSON: SIMPLE_JSON, _LATEST_HTML: SIMPLE_HTML, "*/*": "text/html", "text/*": "text/html",
            "application/*": SIMPLE_JSON,
        }.get(media, media)
        if offered not in _OFFERS:
            continue
        candidate = (q, -_OFFERS.index(offered), offered)
        if best is None or candidate > best:
            best = candidate
    return best[2] if best else None


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
        super().__init__(*args, **kwargs)

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
        if fs_path.is_dir() and parsed.path.endswith("/") and (fs_path / PAGE_JSON).is_file() \
                and (fs_path / PAGE_HTML).is_file():
            query = urllib.parse.parse_qs(parsed.query).get("format", [None])[0]
            query = query.replace(" ", "+") if query else None  # an unencoded "+json" reads as " json"
            chosen = negotiate(self.headers.get("Accept"), query)
            if chosen is None:
                self.send_error(HTTPStatus.NOT_ACCEPTABLE, "Not Acceptable",
                                f"this index serves {SIMPLE_JSON}, {SIMPLE_HTML} and text/html")
                return None
            page = fs_path / (PAGE_JSON if chosen == SIMPLE_JSON else PAGE_HTML)
            return self._send_file(page, chosen if chosen != "text/html" else "text/html; charset=utf-8")
        return super().send_head()

    def _confined(self, fs_path: Path) -> bool:
        """Whether the path, symlinks resolved, stays inside the served folder and names no dot-file there."""
        root = Path(self.directory).resolve()
        if not fs_path.exists() and not fs_path.is_symlink():
            return True  # nothing there: the normal 404 (or a PEP 503 redirect) follows
        resolved = fs_path.resolve(strict=True)
        if not resolved.is_relative_to(root):
            return False
        return not any(p.startswith(".") for p in resolved.relative_to(root).parts)

    def _send_file(self, path: Path, content_type: str):
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        st = os.fstat(f.fileno())
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(st.st_size))
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Vary", "Accept")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        return f

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
        """Folder listings without dot-files (the lock, temp files of a publish in progress)."""
        try:
            names = sorted(n for n in os.listdir(path) if not n.startswith(".")
                           and self._confined(Path(path) / n))  # no name of a link pointing out
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "No permission to list directory")
            return None
        shown = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        items = []
        for name in names:
            suffix = "/" if os.path.isdir(os.path.join(path, name)) else ""
            items.append(f'<li><a href="{urllib.parse.quote(name + suffix)}">{_esc(name + suffix)}</a></li>')
        body = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{_esc(shown)}</title></head>"
                f"<body><h1>{_esc(shown)}</h1><ul>{''.join(items)}</ul></body></html>\n").encode()
        import io

        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format: str, *args: object) -> None:
        stream = self.log_stream or sys.stderr
        stream.write(f"{self.address_string()} - [{self.log_date_time_string()}] {format % args}\n")
        stream.flush()


def _esc(text: str) -> str:
    import html

    return html.escape(text)


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8000,
                log_stream: IO[str] | None = None) -> ThreadingHTTPServer:
    """A server for ``root`` (not yet serving: call ``serve_forever``); port 0 picks a free port."""
    import socket

    handler = partial(IndexHandler, directory=str(root), log_stream=log_stream)
    server_class = ThreadingHTTPServer
    if ":" in host:  # an IPv6 address such as ::1 or ::
        server_class = cast(type[ThreadingHTTPServer],  # a subclass, by construction
                            type("ThreadingHTTPServerV6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6}))
    server = server_class((host, port), handler)
    server.daemon_threads = True
    return server


def base_url(server: ThreadingHTTPServer) -> str:
    address, port = server.server_address[:2]
    host = str(address)  # a str for an AF_INET/AF_INET6 server
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
