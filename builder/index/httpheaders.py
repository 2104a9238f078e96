"""The request headers `builder serve` parses itself: ``Accept`` negotiated against the simple index's formats
(PEP 691) and ``Range`` read as one byte range (RFC 9110 §14), each in one bounded pass over the text."""

from __future__ import annotations

import re
from typing import Literal

from builder.index.pages import SIMPLE_HTML, SIMPLE_JSON

_LATEST_JSON = "application/vnd.pypi.simple.latest+json"
_LATEST_HTML = "application/vnd.pypi.simple.latest+html"
# What we can serve, in our order of preference when a client rates several equally.
_OFFERS = (SIMPLE_JSON, SIMPLE_HTML, "text/html")
UNSATISFIABLE: Literal["unsatisfiable"] = "unsatisfiable"
_DIGITS = re.compile(r"[0-9]+")
_OWS = " \t"  # HTTP's optional white space
MAX_RANGE_DIGITS = 20  # a longer position is past any file's end


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


def byte_range(header: str | None, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """The one byte range (first, last; inclusive) a ``Range`` header asks of ``size`` bytes, ``UNSATISFIABLE``
    (416) when it starts past the end, or None for the whole file: no header, another unit, a malformed value or
    several ranges (RFC 9110 §14.2 lets a server ignore those and answer 200)."""
    parsed = _parse_range(header or "")
    if parsed is None:
        return None
    first_text, last_text = parsed
    if not first_text:  # bytes=-n: the last n bytes
        suffix = int(last_text)
        return UNSATISFIABLE if suffix == 0 or size == 0 else (max(0, size - suffix), size - 1)
    first = int(first_text)
    last = int(last_text) if last_text else size - 1
    if last_text and last < first:
        return None  # malformed: ignored
    if first >= size:
        return UNSATISFIABLE
    return first, min(last, size - 1)


def _parse_range(header: str) -> tuple[str, str] | None:
    """The two positions of ``bytes = first - last`` (either may be empty, not both), in one pass over the text
    (a regex with optional white space around optional digits backtracked cubically on a 12.8 KB header); None for
    anything else."""
    unit, equals, spec = header.partition("=")
    if not equals or unit.strip(_OWS).lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.partition("-")
    first, last = first.strip(_OWS), last.strip(_OWS)
    if not dash or not (first or last) or any(p and not _DIGITS.fullmatch(p) for p in (first, last)):
        return None
    return _clamped(first), _clamped(last)


def _clamped(digits: str) -> str:
    """A position without its leading zeros, cut to ``MAX_RANGE_DIGITS`` (int() refuses over 4300 digits)."""
    return (digits.lstrip("0") or "0")[:MAX_RANGE_DIGITS] if digits else ""
