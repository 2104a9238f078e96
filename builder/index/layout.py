"""The wheelhouse's layout: the one place that names its folders and files.

::

    <root>/wheels/<file>.whl             the wheels
    <root>/wheels/<file>.whl.metadata    PEP 658 sidecar: the wheel's METADATA, byte for byte
    <root>/records/<file>.whl.json       build record + inspect + test results per wheel
    <root>/logs/<file>.whl.log           the build log, copied in at publish time when it exists
    <root>/simple/                       the combined index: index.html (PEP 503) + index.json (PEP 691)
    <root>/simple/<project>/             per project: index.html + index.json
    <root>/channels/<label>/simple/...   the same, holding only wheels whose local label is <label>
    <root>/channels/index.html           the list of channels
    <root>/.generations/<N>/simple/...   a generation of the pages: ``simple`` and ``channels`` above are the
    <root>/.generations/<N>/channels/... symlinks ``simple -> .generations/current/simple`` (and channels), and
    <root>/.generations/current -> <N>   ``current`` is switched to a new generation by one rename (index/txn.py)
    <root>/index.html                    the dashboard (index/dashboard.py)
    <root>/assets.json                   where the wheels are published as release assets, when they are
                                         (index/assets.py): the pages then link each wheel by absolute URL
    <root>/staging/                      a wheelhouse of its own: built, import-tested, awaiting GPU tests
    <root>/.publish.lock                 held by every change (index/txn.py)
    <root>/.publish-journal.json         a committed transaction not yet finished (index/txn.py)

The relative paths (``record_path`` ...) are POSIX strings, the same under a folder and under a URL, so a reader of
a served wheelhouse (user/fit.py, index/mirror.py) and the pages' links spell nothing themselves; ``Layout`` joins
them onto a folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

WHEELS = "wheels"
RECORDS = "records"
LOGS = "logs"
SIMPLE = "simple"
CHANNELS = "channels"
CHANNELS_KEY = "channels"  # the list in channels/index.json: [{"name": label}, …] (pages.py writes, pull reads)
STAGING = "staging"
PAGE_HTML = "index.html"  # in every index folder (PEP 503), and the dashboard at the root
PAGE_JSON = "index.json"  # beside it (PEP 691)
LOCK = ".publish.lock"
JOURNAL = ".publish-journal.json"
ASSETS = "assets.json"  # the assets setting (index/assets.py): published with the pages, so a pull restores it
TEMP_SUFFIX = ".builder-tmp"  # staged files: .<name>.<random>.builder-tmp beside their final path
GENERATIONS = ".generations"  # the page generations: <N>/ and the ``current`` link (index/txn.py)
CURRENT = "current"
PAGE_TREES = (SIMPLE, CHANNELS)  # the page trees: symlinks through GENERATIONS/CURRENT, switched together


def wheel_path(filename: str) -> str:
    return f"{WHEELS}/{filename}"


def sidecar_path(filename: str) -> str:
    return f"{WHEELS}/{filename}.metadata"


def record_path(filename: str) -> str:
    return f"{RECORDS}/{filename}.json"


def log_path(filename: str) -> str:
    return f"{LOGS}/{filename}.log"


def simple_path(label: str | None = None) -> str:
    """The folder of an index: the combined one, or the channel of ``label`` (``channels/<label>/simple/``)."""
    return f"{CHANNELS}/{label}/{SIMPLE}/" if label else f"{SIMPLE}/"


def project_path(project: str, label: str | None = None) -> str:
    return f"{simple_path(label)}{project}/"


def wheels_href(label: str | None = None) -> str:
    """The link from a project page of that index to the wheels: ``../../wheels/`` (``../../../../`` in a channel)."""
    depth = project_path("p", label).count("/")
    return "../" * depth + f"{WHEELS}/"


def staging_href() -> str:
    """The staging area, relative to the root (the main dashboard links its staged wheels through it)."""
    return f"{STAGING}/"


class Layout:
    """The paths of one wheelhouse rooted at ``root``; nothing is read or written here but ``wheel_files``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheels = root / WHEELS
        self.records = root / RECORDS
        self.logs = root / LOGS
        self.simple = root / SIMPLE
        self.channels = root / CHANNELS
        self.dashboard = root / PAGE_HTML
        self.generations = root / GENERATIONS
        self.assets_file = root / ASSETS

    @classmethod
    def holding(cls, wheel: Path) -> Self:
        """The wheelhouse a wheel file sits in when it sits in one (``<root>/wheels/<file>``)."""
        return cls(wheel.parent.parent)

    def staging_paths(self) -> Layout:
        return Layout(self.root / STAGING)

    def wheel_file(self, filename: str) -> Path:
        return self.root / wheel_path(filename)

    def sidecar_file(self, filename: str) -> Path:
        return self.root / sidecar_path(filename)

    def record_file(self, filename: str) -> Path:
        return self.root / record_path(filename)

    def log_file(self, filename: str) -> Path:
        return self.root / log_path(filename)

    def index(self, label: str | None = None) -> Path:
        """The folder of the combined index, or of the channel of ``label``."""
        return self.root / simple_path(label)

    def project_page(self, project: str, label: str | None = None, *, json: bool = False) -> Path:
        return self.root / project_path(project, label) / (PAGE_JSON if json else PAGE_HTML)

    def has_index(self) -> bool:
        return (self.simple / PAGE_HTML).is_file()

    def wheel_files(self) -> list[Path]:
        """The wheels here (never a temp file of a transaction: those start with a dot)."""
        if not self.wheels.is_dir():
            return []
        return sorted(w for w in self.wheels.glob("*.whl") if not w.name.startswith(".") and w.is_file())

    def record_files(self) -> list[Path]:
        """The records here (``records/<wheel>.json``), sorted; ``recorded_wheel`` names the wheel of one."""
        return sorted(self.records.glob("*.whl.json")) if self.records.is_dir() else []


def recorded_wheel(record_file: Path) -> str:
    """The wheel file name a record file is of."""
    return record_file.name.removesuffix(".json")
