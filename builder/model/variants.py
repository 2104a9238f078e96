"""Wheel variants (PEP 825): one thin wheel per GPU architecture beside the plain wheel, chosen by the installer.

A variant wheel's file name ends in a label (``…-linux_x86_64-sm120.whl``); its ``*.dist-info/variant.json`` and
the index's ``{name}-{version}-variants.json`` map the label to properties of the NVIDIA provider namespace
(``sm_arch = 120_real``, ``cuda_version_lower_bound = 13.0``). uv with ``--preview-features wheel-variants`` asks
its built-in NVIDIA provider which properties this machine supports (``nvidia-smi``; or
``NV_VARIANT_PROVIDER_FORCE_SM_ARCH`` / ``…_FORCE_CUDA_DRIVER_VERSION``) and installs the matching variant; a tool
that does not know variants skips the labelled files and takes the plain wheel, which is always published too.

Everything an installer checks is defined here, once: the schema URL uv accepts, the provider uv runs built in.
tests/test_variants.py fails when the uv this project installs no longer accepts them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import InspectError
from builder.core.wheelfile import LABEL, dist_info_dir, read_entries, split_label
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion

# uv accepts only the schema URLs it knows: tests/test_variants.py (test_the_installed_uv_picks_the_variant_for_the_gpu)
# fails when the uv this project installs stops accepting this one
SCHEMA = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
NAMESPACE = "nvidia"
# uv runs this provider built in; under another plugin-api it skips the namespace. uv 0.13.9 refuses the whole file
# when a provider has an `enable-if` marker ("did not match any variant of untagged enum ProviderKind")
PROVIDER = {
    "plugin-api": "nvidia_variant_provider.plugin:NvidiaVariantPlugin",
    # PyPI has only a 0.0.0a0 release: a bound that names that pre-release admits it (>=0.0.1 matched nothing)
    "requires": ["nvidia-variant-provider>=0.0.0a0,<1.0.0"],
}
UV_PREVIEW_FEATURE = "wheel-variants"
# uv takes the flag since 0.13.1, but 0.13.1-0.13.5 install the plain wheel; 0.13.6 picks the variant (the FORCE
# variables too): measured with the 0.13.5, 0.13.6 and 0.13.9 releases from PyPI (docs/USING.md "variants")
UV_MIN_VERSION = "0.13.6"
FORCE_SM_ARCH = "NV_VARIANT_PROVIDER_FORCE_SM_ARCH"  # "12.0": the GPU the provider reports
FORCE_DRIVER = "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION"  # "13.0": the driver's CUDA version
FILE_IN_WHEEL = "variant.json"
VARIANTS_SUFFIX = "-variants.json"  # {name}-{version}-variants.json, listed on the project page


@dataclass(frozen=True, order=True)
class Variant:
    """A thin wheel: the SASS of one arch only, for drivers that run the toolkit's CUDA version or newer."""

    arch: Arch
    cuda_floor: str  # "13.0": the CUDA version a driver must support (the toolkit's major.minor)

    @classmethod
    def for_build(cls, arch: Arch, cuda: CudaVersion) -> Variant:
        return cls(Arch(arch.number, arch.suffix), cuda.line)

    @property
    def label(self) -> str:
        return f"sm{self.arch.code}"

    def properties(self) -> dict[str, dict[str, list[str]]]:
        return {NAMESPACE: {"cuda_version_lower_bound": [self.cuda_floor], "sm_arch": [f"{self.arch.number}_real"]}}


    def forced_install(self, environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """uv's arguments and environment that install this variant whatever GPU this machine has (the import
        test of a variant on a build machine): the preview flag, and the provider told this arch and driver."""
        major, minor = divmod(self.arch.number, 10)
        env = {**environ, FORCE_SM_ARCH: f"{major}.{minor}", FORCE_DRIVER: self.cuda_floor}
        return ["--preview-features", UV_PREVIEW_FEATURE], env

    @classmethod
    def from_metadata(cls, label: str, table: dict[str, dict]) -> Variant:
        """The variant ``label`` of a variants table (ValueError when it is not one this builder writes)."""
        props = table.get(label, {}).get(NAMESPACE, {})
        archs, floors = props.get("sm_arch", []), props.get("cuda_version_lower_bound", [])
        match = re.fullmatch(r"(\d+)_real", archs[0]) if len(archs) == 1 and len(floors) == 1 else None
        if match is None:
            raise ValueError(f"variant {label}: not one sm_arch and one cuda_version_lower_bound ({props})")
        variant = cls(Arch(int(match.group(1)), label.removeprefix(f"sm{match.group(1)}")), floors[0])
        if variant.label != label:
            raise ValueError(f"variant {label}: its properties name {variant.label}")
        return variant


def metadata(variants: Iterable[Variant] | dict[str, dict]) -> dict:
    """The JSON of ``variant.json`` (one variant) and of ``{name}-{version}-variants.json`` (all of them)."""
    table = variants if isinstance(variants, dict) else {v.label: v.properties() for v in variants}
    return {
        "$schema": SCHEMA,
        "default-priorities": {"namespace": [NAMESPACE]},
        "providers": {NAMESPACE: PROVIDER},
        "variants": dict(sorted(table.items())),
    }


def dumps(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode()


def variant_name(plain: str, variant: Variant) -> str:
    return plain[:-4] + f"-{variant.label}.whl"


def variants_file(filename: str) -> str:
    """``{name}-{version}-variants.json`` for a (plain or variant) wheel's file name, as the wheel spells them."""
    name, version = split_label(filename)[0].split("-")[:2]
    return f"{name}-{version}{VARIANTS_SUFFIX}"


def read_metadata(data: bytes, source: str) -> dict[str, dict]:
    """The variants table of a variant.json / variants.json, checked as uv checks it (schema, namespace)."""
    try:
        loaded = json.loads(data)
    except ValueError as e:
        raise ValueError(f"{source}: not JSON ({e})") from e
    if not isinstance(loaded, dict) or loaded.get("$schema") != SCHEMA:
        raise ValueError(f"{source}: $schema is not {SCHEMA}")
    table = loaded.get("variants")
    if not isinstance(table, dict) or not all(LABEL.match(k) for k in table):
        raise ValueError(f"{source}: no valid 'variants' table")
    return table


def of_wheel(wheel: Path) -> Variant | None:
    """The variant a wheel file is (from its label and its variant.json); None for a plain wheel."""
    label = split_label(wheel.name)[1]
    if label is None:
        return None
    entries = read_entries(wheel)
    name = f"{dist_info_dir(entries, wheel.name)}/{FILE_IN_WHEEL}"
    if name not in entries:
        raise InspectError(f"{wheel.name}: a variant label ({label}) but no {name}")
    try:
        return Variant.from_metadata(label, read_metadata(entries[name], f"{wheel.name}: {name}"))
    except ValueError as e:
        raise InspectError(str(e), "variants this builder makes name one sm_arch and one driver floor") from e
