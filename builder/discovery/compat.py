"""Which torch builds exist for which CUDA version on which index: read from the indexes (torchindex.py).

A C++/CUDA extension must be compiled with the same CUDA major.minor that its torch was built with, and it
runs only with that torch. PyPI carries exactly one CUDA flavour per torch release; PyTorch's own indexes carry
one flavour per index (``.../whl/cu128``), with a ``+cu128`` local label on every wheel. Nothing here is a
hand-kept table: every answer comes from a ``Listing`` (index, cache or the shipped snapshot) and says so.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.simpleindex import reading
from builder.discovery.torchindex import (
    MIN_TORCH,
    PYPI_SIMPLE,
    PYTORCH_CHANNELS,
    PYTORCH_INDEX,
    Listing,
    discover,
    toolkit_versions,
)
from builder.model.cuda import IMAGE_CUDAS, CudaVersion

__all__ = [
    "PYPI_SIMPLE",
    "PYTORCH_INDEX",
    "TorchIndex",
    "check_holds_torch",
    "check_torch_listed",
    "custom_index_url",
    "check_torch_matches_cuda",
    "default_torch",
    "known_cuda",
    "known_indexes",
    "resolve_index",
    "table_rows",
    "torch_cuda_unverified",
]

# CUDA 12.x has no compiler on PyPI: these are the releases the docker and host toolchains are known to serve.
# CUDA 13+ is every minor that PyPI's cuda-toolkit carries (discovered; the shipped snapshot without settings).
CUDA_12 = ("12.6", "12.8", "12.9")


def known_cuda(settings: Settings | None = None) -> tuple[CudaVersion, ...]:
    """The CUDA lines a target may name: the one list that ``--cuda`` and farm.toml's ``cuda`` are checked against:
    the CUDA 12 releases the docker and host toolchains serve, every minor PyPI's cuda-toolkit carries, and every
    CUDA a Dockerfile in dockerfiles/ builds an image for (a CUDA that some toolchain can provide; a host toolkit
    of another line is accepted by ``--cuda`` too: stages/plan.validate_cuda).
    ``settings=None``: the shipped snapshot only (no cache, no network), as for ``--help``."""
    lines = [*CUDA_12, *toolkit_versions(settings)[0], *IMAGE_CUDAS]
    unique = sorted({CudaVersion.parse(v).line: CudaVersion.parse(v) for v in lines}.values())
    return tuple(unique)


def is_known_cuda(cuda: CudaVersion, settings: Settings | None = None) -> bool:
    return any(cuda.same_line(known) for known in known_cuda(settings))


def known_cuda_text(settings: Settings | None = None) -> str:
    """``12.6, 12.8, ...``: the known lines as messages name them."""
    return ", ".join(map(str, known_cuda(settings)))


# The indexes known by name: PyPI and PyPI's-style names for PyTorch's channels.
KNOWN_INDEXES: dict[str, str] = {
    "pypi": PYPI_SIMPLE,
    **{f"pytorch-{c}": PYTORCH_INDEX.format(flavour=c) for c in PYTORCH_CHANNELS},
}


@dataclass(frozen=True)
class TorchIndex:
    """A package index that serves torch, and the torch releases it has per CUDA version (as discovered)."""

    name: str
    url: str
    listing: Listing | None = field(default=None, compare=False, repr=False)

    @property
    def torch_by_cuda(self) -> dict[str, tuple[str, ...]]:
        return self.listing.torch_by_cuda() if self.listing else {}

    @property
    def source(self) -> str:
        """index / cache / snapshot / none: where this index's table came from."""
        return self.listing.source if self.listing else "none"

    def cuda_of(self, torch: str) -> str | None:
        """The CUDA line ("13.2") or "cpu" that ``torch`` was built for on this index; None where unknown."""
        release = self.listing.release(torch) if self.listing else None
        return release.cuda if release else None

    def torch_for(self, cuda: CudaVersion) -> tuple[str, ...]:
        """The torch releases built for ``cuda``'s line on this index, oldest first."""
        return self.torch_by_cuda.get(cuda.line, ())

    def oldest_python(self, torch_minor: Version) -> Version | None:
        """The oldest Python any release of ``torch_minor`` (2.11: 2.11.0, 2.11.1, …) has a wheel for on this index,
        from its wheel names; None where the index lists none (a local index without that minor)."""
        releases = self.listing.releases if self.listing else ()
        pythons = [Version(p.rstrip("t")) for r in releases for p in r.pythons
                   if (Version(r.version).major, Version(r.version).minor) == (torch_minor.major, torch_minor.minor)]
        return min(pythons, default=None)


def known_indexes(settings: Settings | None) -> list[TorchIndex]:
    """Every known index as discovered; their reads share one network deadline (simpleindex.reading)."""
    with reading():
        return [TorchIndex(name, url, discover(name, url, settings)) for name, url in KNOWN_INDEXES.items()]


def resolve_index(spec: str | None, settings: Settings | None = None, *, pre: bool = False,
                  refresh: bool = False) -> TorchIndex:
    """``None``/``pypi`` → PyPI; a known name; ``cu128``; or any URL (discovered too where it can be read).

    ``settings=None`` answers from the shipped snapshot only (no cache, no network): for validation."""
    name = "pypi" if spec in (None, "pypi") else spec if spec in KNOWN_INDEXES else (
        f"pytorch-{spec}" if f"pytorch-{spec}" in KNOWN_INDEXES else None)
    if name is None:
        for known, url in KNOWN_INDEXES.items():
            if spec is not None and spec.rstrip("/") == url:
                name = known
    if name is not None:
        return TorchIndex(name, KNOWN_INDEXES[name], discover(name, KNOWN_INDEXES[name], settings, pre=pre,
                                                              refresh=refresh))
    assert spec is not None
    url = custom_index_url(spec)
    if settings is None:
        return TorchIndex("custom", url, None)
    listing = discover("custom", url, settings, pre=pre, refresh=refresh)
    check_holds_torch(spec, listing, settings)
    return TorchIndex("custom", url, listing)


INDEX_SCHEMES = ("http", "https", "file")
_INDEX_CURE = "give an http(s):// simple index, a local index folder (a path or file:// URL) or a known name: "


def custom_index_url(spec: str) -> str:
    """The URL of a ``--torch-index`` that is not a known name, checked without the network: a scheme uv and this
    builder both read (http, https, file) and, for a local folder, that it exists and holds a torch project
    (``torch/index.html`` or ``torch/index.json``). Anything else would be replaced by a torch from elsewhere."""
    known = ", ".join(KNOWN_INDEXES)
    if "://" not in spec and not spec.startswith("/"):
        raise UsageError(f"--torch-index: {spec!r} is neither a URL nor a known index", f"known: {known}")
    if "://" not in spec:
        check_local_index(spec, Path(spec))
        return f"file://{spec}".rstrip("/")
    parsed = urllib.parse.urlsplit(spec)
    scheme = parsed.scheme.lower()
    if scheme not in INDEX_SCHEMES:
        raise UsageError(f"--torch-index {spec}: the {scheme}:// scheme cannot be read (only "
                         f"{', '.join(INDEX_SCHEMES)})", _INDEX_CURE + known)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"--torch-index {spec}: a file:// URL names a folder on this machine, not on "
                             f"{parsed.netloc}", "write file:///path/to/simple or the path itself")
        check_local_index(spec, Path(urllib.parse.unquote(parsed.path)))
    elif not parsed.hostname:
        raise UsageError(f"--torch-index {spec}: the URL names no host", _INDEX_CURE + known)
    return spec.rstrip("/")


def check_local_index(spec: str, folder: Path) -> None:
    """Refuse a local simple index that does not exist or does not serve torch, saying which."""
    cure = "give the folder of a PEP 503 simple index: it holds torch/index.html (or torch/index.json)"
    if not folder.exists():
        raise UsageError(f"--torch-index {spec}: no such folder", cure)
    if not folder.is_dir():
        raise UsageError(f"--torch-index {spec}: not a folder", cure)
    project = folder / "torch"
    if not ((project / "index.html").is_file() or (project / "index.json").is_file()):
        raise UsageError(f"--torch-index {spec}: the folder holds no torch project (no torch/index.html or "
                         "torch/index.json)", cure)


def check_holds_torch(spec: str, listing: Listing, settings: Settings) -> None:
    """Refuse a custom index whose torch list is neither readable now nor cached, or that lists no torch: the
    build would otherwise install a torch from somewhere else."""
    if listing.source == "none":
        if settings.offline and not listing.url.startswith("file://"):
            raise UsageError(f"--torch-index {spec}: its torch list is not cached, and --offline reads no index",
                             "run once without --offline (the list is then cached), or use a known index name")
        raise UsageError(f"--torch-index {spec}: its torch list cannot be read ({listing.note})",
                         "check the URL (it is the index's simple/ root, which serves torch/), or use a known index "
                         f"name: {', '.join(KNOWN_INDEXES)}")
    if not listing.releases:
        read = "read now" if listing.source == "index" else f"the {listing.source} of {listing.read_at}"
        raise UsageError(f"--torch-index {spec}: lists no torch release {MIN_TORCH} or newer ({read})",
                         "check that it is the index's simple/ root and that it serves torch wheels")


def default_torch(index: TorchIndex, cuda: CudaVersion) -> str:
    """The newest torch on ``index`` built for ``cuda``; a clear error when there is none."""
    versions = index.torch_for(cuda)
    if not versions:
        where = ", ".join(f"{c}: {v[0]}–{v[-1]}" for c, v in index.torch_by_cuda.items()) or "nothing known"
        raise UsageError(
            f"no torch build for CUDA {cuda.line} is known on index {index.name} ({where}; read from "
            f"{index.source})",
            "pass --torch X.Y.Z (and --torch-index for PyTorch's cuXYZ index), or another --cuda",
        )
    return max(versions, key=Version)


def check_torch_matches_cuda(index: TorchIndex, torch: str, cuda: CudaVersion,
                             settings: Settings | None = None) -> None:
    """Refuse a torch whose CUDA differs from the requested one on an index we can classify."""
    found = index.cuda_of(str(Version(torch).public))
    key = cuda.line
    if found is not None and found != key:
        public = str(Version(torch).public)
        alternatives = [i for i in known_indexes(settings) if public in i.torch_for(cuda)]
        other = default_torch_or_none(index, cuda)
        hint = (f"use --torch-index {alternatives[0].name}{_hearsay(alternatives[0], public)}" if alternatives
                else f"use --cuda {found}") + (
            f", or omit --torch to get {other}" if other else f", or --cuda {found}" if alternatives else "")
        raise UsageError(f"torch {torch} on {index.name} is a CUDA {found} build, not CUDA {key}", hint)


def listed_from_index(listing: Listing | None) -> bool:
    """Whether ``listing`` was read from its index (now, from the cache or in the snapshot), so that a release it
    lacks is absent there; a list from PyTorch's release notes (an unreachable channel) or no list at all is not."""
    return listing is not None and any(not r.evidence.startswith("release notes") for r in listing.releases)


def nearest_releases(versions: tuple[str, ...], wanted: str, most: int = 4) -> list[str]:
    """The releases in ``versions`` nearest to ``wanted``: those of its minor, and the next one either side."""
    target = Version(Version(wanted).public)
    ordered = sorted(Version(v) for v in versions)
    same = [v for v in ordered if v.release[:2] == target.release[:2]]
    below = [v for v in ordered if v < target][-1:]
    above = [v for v in ordered if v > target][:1]
    picked = sorted(set(same[-(most - 2):] + below + above))
    return [str(v) for v in picked]


def check_torch_listed(index: TorchIndex, torch: str, cuda: CudaVersion) -> None:
    """Refuse a torch release that ``index`` does not list (where its list was read from it: live, cached or in the
    shipped snapshot, so this works offline), naming the nearest releases it has for ``cuda``."""
    listing = index.listing
    try:
        if listing is None or not listed_from_index(listing) or listing.release(torch) is not None:
            return
    except InvalidVersion:
        return
    nearest = nearest_releases(index.torch_for(cuda), torch)
    lines = ", ".join(index.torch_by_cuda) or "none"
    have = (f"its CUDA {cuda.line} releases nearest to it: {', '.join(nearest)}; pass one of those as --torch"
            if nearest else f"it has no CUDA {cuda.line} torch at all (CUDA lines there: {lines}); pick another --cuda"
            " or --torch-index")
    stale = "" if listing.source == "index" else (
        f", or re-read the index with BUILDER_INDEX_REFRESH=1 (not --offline) if {torch} was released after "
        f"{listing.read_at or 'that list was read'}")
    raise UsageError(f"torch {torch} is not on {index.name}: its release list ({source_text(index)}) has no such "
                     "version", have + stale)


def torch_cuda_unverified(index: TorchIndex, torch: str) -> str | None:
    """Why the CUDA that ``torch`` was built with is not known from ``index`` (None: it is known). The plan then
    takes the CUDA from ``--cuda`` and says so; the build venv checks torch.version.cuda before compiling."""
    listing = index.listing
    try:
        release = listing.release(torch) if listing else None
    except InvalidVersion:
        release = None
    if release is None:
        if listing is None or not listing.releases:
            return f"the torch list of {index.name} could not be read ({listing.note if listing else 'not read'})"
        return f"{index.name}'s list is from PyTorch's release notes, not read from the index, and lacks {torch}"
    if release.cuda is None:
        return f"{index.name} does not say which CUDA torch {release.version} was built with: {release.evidence[:160]}"
    return None


def check_torch_has_python(index: TorchIndex, torch: str, python: str) -> None:
    """Refuse a Python older than every wheel of the torch release (where the index's wheel names say)."""
    release = index.listing.release(torch) if index.listing else None
    if release is None or not release.pythons:
        return
    try:
        wanted = Version(python)
    except InvalidVersion:
        return
    key = f"{wanted.major}.{wanted.minor}"
    oldest = min(Version(p.rstrip("t")) for p in release.pythons)
    # Older than the release's oldest: refused here. A newer one is left to the interpreter lookup (which says
    # when there is no such interpreter) and to uv (a torch without wheels for it fails to install).
    if key not in release.pythons and Version(key) < oldest:
        raise UsageError(f"torch {torch} on {index.name} has no wheel for Python {key}",
                         f"it has {', '.join(release.pythons)}: pass --python one of those")


def _hearsay(index: TorchIndex, torch: str) -> str:
    """' (per release notes)' where the index's row was not read from the index itself."""
    release = index.listing.release(torch) if index.listing else None
    return " (per PyTorch's release notes; not read from that index)" if release and release.evidence.startswith(
        "release notes") else ""


def default_torch_or_none(index: TorchIndex, cuda: CudaVersion) -> str | None:
    try:
        return default_torch(index, cuda)
    except UsageError:
        return None


def torch_cuda(index: TorchIndex, torch: str, fallback: CudaVersion) -> CudaVersion:
    """The CUDA the given torch was built with on ``index`` (``fallback`` where the index does not say)."""
    found = index.cuda_of(torch)
    return CudaVersion.parse(found) if found and found[:1].isdigit() else fallback


def table_rows(settings: Settings | None = None) -> list[tuple[str, str, str, str]]:
    """(index, cuda, torch versions, source) rows, for ``builder torch-table`` and the docs."""
    rows = []
    for index in known_indexes(settings):
        source = source_text(index)
        for cuda, versions in index.torch_by_cuda.items():
            rows.append((index.name, cuda, ", ".join(versions), source))
    return rows


def source_text(index: TorchIndex) -> str:
    listing = index.listing
    if listing is None:
        return "none"
    where = {"index": index.url, "cache": f"cache of {index.url}", "snapshot": "shipped snapshot"}.get(
        listing.source, listing.source)
    return f"{where}, read {listing.read_at}" + (f" ({listing.note})" if listing.note else "")
