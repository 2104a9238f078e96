"""The torch snapshot shipped in the package (builder/data/torch-snapshot.json): written by
``builder torch-table --write-snapshot`` from a live read of every index, with release-notes rows for a channel
that cannot be reached."""

from __future__ import annotations

import json
from pathlib import Path

from builder.core.fsutil import atomic_write
from builder.core.settings import Settings
from builder.discovery.torchindex import (
    PYPI_SIMPLE,
    PYTORCH_CHANNELS,
    PYTORCH_INDEX,
    SNAPSHOT,
    TOOLKIT_PROJECT,
    Listing,
    Release,
    discover,
    listing_json,
    now_stamp,
    read_toolkit_versions,
)
from builder.model.cuda import CudaVersion

# PyTorch's channels are not reachable from every machine (not from the one the first snapshot was written on).
# When a channel cannot be read, the snapshot carries these rows from PyTorch's release notes and RFCs, marked as
# such; a later --write-snapshot where the channel is reachable replaces them with what the channel serves.
RELEASE_NOTES: dict[str, tuple[str, ...]] = {
    "cu126": ("2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0",
              "2.14.1"),
    "cu128": ("2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0"),  # cu128 ends with 2.11
    "cu129": ("2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0"),
    "cu130": ("2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"),
    "cu132": ("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"),
}
RELEASE_NOTES_READ = "2026-12-01"


def release_notes_listing(channel: str) -> Listing:
    parsed = CudaVersion.from_flavour(channel)
    assert parsed, channel
    cuda = parsed.line
    evidence = f"release notes, not read from the index ({RELEASE_NOTES_READ})"
    releases = tuple(Release(v, cuda, (), evidence, RELEASE_NOTES_READ) for v in RELEASE_NOTES[channel])
    return Listing(f"pytorch-{channel}", PYTORCH_INDEX.format(flavour=channel), releases, "snapshot",
                   RELEASE_NOTES_READ, "channel not reachable when the snapshot was written: rows from release notes")


def build_snapshot(settings: Settings) -> tuple[list[Listing], tuple[str, ...]]:
    """Read every known index now (falling back to release notes for an unreachable channel)."""
    listings = [discover("pypi", PYPI_SIMPLE, settings, refresh=True)]
    if listings[0].source != "index":
        raise OSError(f"{PYPI_SIMPLE} could not be read: the snapshot is written only from a live read")
    for channel in PYTORCH_CHANNELS:
        listing = discover(f"pytorch-{channel}", PYTORCH_INDEX.format(flavour=channel), settings, refresh=True)
        listings.append(listing if listing.source == "index" else release_notes_listing(channel))
    return listings, read_toolkit_versions()


def write_snapshot_file(listings: list[Listing], toolkits: tuple[str, ...], path: Path = SNAPSHOT) -> Path:
    data = {"comment": "written by `builder torch-table --write-snapshot`; never edit by hand",
            "written_at": now_stamp(), "indexes": [listing_json(listing) for listing in listings],
            "cuda_toolkit": {"versions": list(toolkits), "read_at": now_stamp(), "url": f"{PYPI_SIMPLE}/{TOOLKIT_PROJECT}"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1) + "\n")
    return path
