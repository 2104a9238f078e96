"""The variants stage: from a finalized wheel carrying several archs, one thin wheel per arch (PEP 825 variants).

Each variant is the same wheel with every shared object's fatbins sliced to that arch's SASS (core/fatbin.py: the
same compile, no second nvcc pass), ``variant.json`` added to its .dist-info, its build record naming the one arch
and the variant, and the label appended to its file name. The pipeline inspects, import-tests and kernel-tests each
variant like any wheel before it is published beside the plain wheel.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from builder.core.errors import InspectError
from builder.core.fatbin import FatbinError, keep_only, sass_only, shared_object_code
from builder.core.wheelfile import dist_info_dir, modes, read_entries, split_label, write_wheel
from builder.model import variants
from builder.model.arch import Arch
from builder.model.records import BuildRecord, VariantInfo
from builder.model.variants import Variant
from builder.stages.finalize import RECORD_FILE


def one_arch_note(wheel: str, archs: Iterable[Arch]) -> str | None:
    """The line said instead of making variants of a wheel built for one arch (a variant would hold the same
    SASS, less its PTX: a copy no installer gains from); None for a wheel of several archs."""
    have = sorted({Arch(a.number, a.suffix) for a in archs}, key=str)
    if len(have) != 1:
        return None
    return f"no variants of {wheel}: it holds one arch ({have[0].sm}), so its variant would be a copy of it"


def make_variant(wheel: Path, variant: Variant, outdir: Path) -> Path:
    """Write ``wheel``'s variant for ``variant.arch`` into ``outdir``. InspectError when a shared object with GPU
    code has none for that arch (the plain wheel was not built for it), naming the object."""
    if split_label(wheel.name)[1] is not None:
        raise InspectError(f"{wheel.name} is a variant already", "make variants from the plain wheel")
    entries = read_entries(wheel)
    info = dist_info_dir(entries, wheel.name)
    sliced = 0
    for name, data in sorted(entries.items()):
        if not _is_shared_object(name) or not data.startswith(b"\x7fELF") or not shared_object_code(data):
            continue
        try:
            entries[name] = keep_only(data, sass_only(variant.arch.number))
        except FatbinError as e:
            raise InspectError(f"{wheel.name}: {name} has no {variant.arch.sm} code to keep for the {variant.label} "
                               f"variant: {e}", f"build the wheel with --arch {variant.arch.number} first") from e
        sliced += 1
    if not sliced:
        raise InspectError(f"{wheel.name} carries no GPU code: a variant per arch means nothing for it",
                           "variants are for CUDA extensions")
    entries[f"{info}/{variants.FILE_IN_WHEEL}"] = variants.dumps(variants.metadata([variant]))
    record_name = f"{info}/{RECORD_FILE}"
    if record_name in entries:
        entries[record_name] = _variant_record(entries[record_name], variant)
    out = outdir / variants.variant_name(wheel.name, variant)
    outdir.mkdir(parents=True, exist_ok=True)
    write_wheel(out, entries, info, modes(wheel))
    return out


def _is_shared_object(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".so") or ".so." in base


def variant_record(record: BuildRecord, variant: Variant) -> BuildRecord:
    """A build record for the variant: its one arch, and what it was sliced from."""
    info = VariantInfo(variant.label, record.archs, variant.properties())
    return record.with_(archs=(str(variant.arch),), variant=info)


def _variant_record(data: bytes, variant: Variant) -> bytes:
    return variant_record(BuildRecord.from_json(json.loads(data)), variant).wheel_bytes()
