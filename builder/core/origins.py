"""Where a published index may send a reader: its own origin, and the ones it was allowed.

A page of a remote index is data, not a command: a wheel URL in it (``file:///dev/zero``, ``/etc/passwd`` joined to a
``file://`` root, ``http://169.254.169.254/…``) must not make ``builder index pull`` or ``builder install --from``
read whatever it names. An ``Origins`` holds what may be read: an http(s) origin (scheme, host, port) as a whole, a
``file://`` root as the folder under it (``..`` resolved first, so it cannot climb out). The index's own root is
always allowed; the folder its ``assets.json`` names (where the index says its wheels live) is added by the reader;
anything else only with ``--allow-origin URL``.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from dataclasses import dataclass

from builder.core.errors import SourceError, UsageError

_DEFAULT_PORTS = {"http": 80, "https": 443}
Place = tuple[str, str, int, str]  # scheme, host, port, folder path (ending in /)


def _place(url: str, *, folder: bool = True) -> Place | None:
    """Where ``url`` is: its scheme, host, port and path (``..`` resolved; with ``folder``, cut to the folder it
    names), for http(s):// and file:// (of this machine); None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in _DEFAULT_PORTS and parts.hostname:
            host, port = parts.hostname.lower(), parts.port or _DEFAULT_PORTS[scheme]
        elif scheme == "file" and parts.netloc in ("", "localhost"):
            host, port = "", 0
        else:
            return None
    except ValueError:  # a port that is not a number, or out of range
        return None
    path = posixpath.normpath("/" + urllib.parse.unquote(parts.path))
    if folder and not parts.path.endswith("/"):
        path = posixpath.dirname(path)
    return scheme, host, port, path.rstrip("/") + "/"


@dataclass(frozen=True)
class Origins:
    """The places (an origin and a folder under it) a reader of one index may fetch from."""

    allowed: tuple[Place, ...]

    @classmethod
    def of(cls, root: str, allow: tuple[str, ...] = ()) -> Origins:
        """The index at ``root`` (its folder) and each ``--allow-origin`` URL (its folder; a bare origin: all of
        it); a UsageError for one that is not http(s)/file."""
        places = []
        for url in (root, *allow):
            place = _place(url if url != root or url.endswith("/") else url + "/")
            if place is None:
                raise UsageError(f"--allow-origin {url!r} is not an http(s):// or file:// URL",
                                 "give the origin a published index links to, e.g. https://host.example/")
            places.append(place)
        return cls(tuple(places))

    def adding(self, url: str) -> Origins:
        place = _place(url)
        return self if place is None or place in self.allowed else Origins((*self.allowed, place))

    def allows(self, url: str) -> bool:
        place = _place(url, folder=False)
        return place is not None and any(place[:3] == a[:3] and place[3].startswith(a[3]) for a in self.allowed)

    def check(self, url: str, named_by: str) -> None:
        """A SourceError (exit 4) unless ``url`` may be fetched; ``named_by``: the page that links it."""
        if not self.allows(url):
            shown = url if len(url) <= 200 else url[:200] + "…"
            raise SourceError(f"{named_by} links {shown}, outside the index's origin; refused, nothing was changed",
                              "only URLs under the index's own root (and its assets.json's) are fetched; give "
                              "--allow-origin URL to trust another")
