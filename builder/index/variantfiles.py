"""The ``{name}-{version}-variants.json`` files of a project page (PEP 825): the label → properties table of every
variant wheel the page lists for that version, written beside the page and linked from it like a file.

They are rendered with the pages from the variant wheels' build records (``BuildRecord.variant``), so they change
as variants are added or removed and never disagree with the wheels listed; unlike a wheel they are not immutable
(a release asset), which is why they live in the pages tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from builder.core.wheelfile import split_label
from builder.model import variants
from builder.model.records import VariantInfo


@dataclass(frozen=True)
class VariantsFile:
    filename: str  # causal_conv1d-1.7.0+cu13-variants.json
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def variants_files(wheels: Iterable[tuple[str, VariantInfo | None]]) -> list[VariantsFile]:
    """One file per (name, version) that has variant wheels among ``wheels`` (file name, its record's variant),
    sorted."""
    tables: dict[str, dict[str, dict]] = {}
    for filename, variant in wheels:
        label = split_label(filename)[1]
        if label is None or variant is None or variant.label != label:
            continue  # a variant whose record does not describe it: listed as a file, matched by no variant tool
        props = {ns: {k: list(v) for k, v in feats.items()} for ns, feats in variant.properties.items()}
        tables.setdefault(variants.variants_file(filename), {})[label] = props
    return [VariantsFile(name, variants.dumps(variants.metadata(table))) for name, table in sorted(tables.items())]
