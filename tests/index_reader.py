"""A reader of a wheelhouse's index that reads it as pip does, to check what readers see while it is published.

``read_index`` starts at ``simple/index.html`` (and each channel's, from ``channels/index.html``), reads every
project page (HTML and JSON), joins each link to the page's URL as a resolver joins it (URL arithmetic, never the
file system's links) and opens the file there through the file system, as a static web server would: every file
a page lists must exist with the sha256 of the link's fragment (HTML) or ``hashes`` (JSON), its ``.metadata``
sidecar with the ``data-core-metadata`` hash, and the size JSON says. Run as a script it loops until a stop file
appears and writes its counts as JSON (the concurrent reader of tests/test_publish_readers.py)."""

from __future__ import annotations

import hashlib
import html.parser
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path


class Inconsistent(AssertionError):
    """What a reader saw that a resolver would fail on."""


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.found.append({k: v or "" for k, v in attrs})


class Reader:
    """One round over the whole index; ``pages`` keeps what each page said, for ``unchanged``."""

    def __init__(self, root: Path) -> None:
        self.base = root.absolute().as_uri() + "/"
        self.pages: dict[str, bytes] = {}
        self.files = 0

    def read_index(self) -> int:
        indexes = ["simple/"]
        channels = self._optional("channels/index.html")
        if channels is not None:
            self.pages["channels/index.html"] = channels
            indexes += [f"channels/{a['href']}" for a in _anchors(channels)]
        for index in indexes:
            self._read_simple(index)
        return self.files

    def unchanged(self) -> bool:
        """Whether every page read in this round still says the same: if not, the round straddled a switch and
        says nothing about one instant."""
        return all(self._optional(url) == data for url, data in self.pages.items())

    def _read_simple(self, index: str) -> None:
        root_html = self._page(index + "index.html")
        projects = [a["href"] for a in _anchors(root_html)]
        listed_json = sorted(p["name"] + "/" for p in json.loads(self._page(index + "index.json"))["projects"])
        if sorted(projects) != listed_json:
            raise Inconsistent(f"{index}: index.html lists {projects}, index.json {listed_json}")
        for project in projects:
            page = index + project
            html_files = {}
            for a in _anchors(self._page(page + "index.html")):
                url, _, fragment = a["href"].partition("#")
                algo, _, digest = fragment.partition("=")
                if algo != "sha256":
                    raise Inconsistent(f"{page}: link {a['href']} has no sha256 fragment")
                meta = a.get("data-core-metadata", "").removeprefix("sha256=")
                html_files[urllib.parse.urljoin(page, url)] = (digest, meta, None)
            json_files = {}
            for f in json.loads(self._page(page + "index.json"))["files"]:
                json_files[urllib.parse.urljoin(page, f["url"])] = (
                    f["hashes"]["sha256"], f["core-metadata"]["sha256"], f["size"])
            if sorted(html_files) != sorted(json_files):
                raise Inconsistent(f"{page}: index.html and index.json list other files")
            for url, (digest, meta, _) in html_files.items():
                size = json_files[url][2]
                if json_files[url][:2] != (digest, meta):
                    raise Inconsistent(f"{page}: index.html and index.json disagree on {url}")
                self._check(url, digest, size, page)
                self._check(url + ".metadata", meta, None, page)

    def _check(self, url: str, digest: str, size: int | None, page: str) -> None:
        data = self._optional(url)
        if data is None:
            raise Inconsistent(f"{page} lists {url}, which does not exist")
        if hashlib.sha256(data).hexdigest() != digest:
            raise Inconsistent(f"{page} lists {url} with sha256 {digest[:12]}…, its bytes have another")
        if size is not None and len(data) != size:
            raise Inconsistent(f"{page} lists {url} with size {size}, it has {len(data)} bytes")
        self.files += 1

    def _page(self, url: str) -> str:
        data = self._optional(url)
        if data is None:
            raise Inconsistent(f"{url} does not exist" + (" (though its index lists it)" if url.count("/") > 1 else ""))
        self.pages[url] = data
        return data.decode()

    def _optional(self, url: str) -> bytes | None:
        path = urllib.request.url2pathname(urllib.parse.urlsplit(urllib.parse.urljoin(self.base, url)).path)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None


def _anchors(page: str | bytes) -> list[dict[str, str]]:
    parser = _Anchors()
    parser.feed(page.decode() if isinstance(page, bytes) else page)
    return parser.found


def read_index(root: Path) -> int:
    """One round over the index at ``root``; the number of files checked. Raises Inconsistent."""
    return Reader(root).read_index()


def loop(root: Path, stop: Path, out: Path) -> None:
    """Read rounds until ``stop`` exists: a round that failed while its pages did not change is a failure;
    one that failed while they changed straddled a switch (counted apart, and retried)."""
    counts = {"rounds": 0, "files": 0, "straddled": 0, "failures": []}
    while not stop.exists():
        reader = Reader(root)
        try:
            counts["files"] += reader.read_index()
            counts["rounds"] += 1
        except Inconsistent as e:
            if reader.unchanged():
                counts["failures"].append(str(e))
            else:
                counts["straddled"] += 1
        time.sleep(0)
    out.write_text(json.dumps(counts))


if __name__ == "__main__":
    loop(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
