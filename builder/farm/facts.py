"""Facts the installability check of the farm (farm/proven.py) reads that the shipped torch snapshot does not carry:
which triton each torch release pins, which torch releases PyPI publishes CUDA wheels of on aarch64, and what each
package's wheels require beyond torch (upstream's Requires-Python and the run-time requirements that constrain
what comes with torch).

A hand-kept table goes stale (DESIGN.md): the checks here never guess past it. A torch release missing from
``TORCH_TRITON`` makes its cells "triton pin of torch X not recorded" (not installable, reason shown), and
tests/test_farm_installable.py fails when a torch of the users' matrix has no row, so a new torch release is a row
to add from its METADATA (``Requires-Dist: triton==X; platform_system == "Linux"``), read through PEP 658.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

# torch release → the triton its Linux wheels pin (PyPI's and PyTorch's channels' builds of one release pin the same):
# 2.7-2.10 from their published METADATA (not re-read on this machine); 2.11-2.15 from DESIGN.md's second round (2026-12-01: 2.11→3.6.0, 2.12→3.7.0,
# 2.13→3.7.1, 2.14→3.8, 2.15→`triton~=3.9.0`; the lowest version each pin admits)
TORCH_TRITON: dict[str, str] = {
    "2.7.0": "3.3.0", "2.7.1": "3.3.1", "2.8.0": "3.4.0", "2.9.0": "3.5.0", "2.9.1": "3.5.1", "2.10.0": "3.6.0",
    "2.11.0": "3.6.0", "2.12.0": "3.7.0", "2.12.1": "3.7.0", "2.13.0": "3.7.1", "2.14.0": "3.8.0", "2.14.1": "3.8.0",
    "2.15.0": "3.9.0",
}

# PyPI's manylinux_2_28_aarch64 torch wheels carry CUDA from 2.9.0 on; its 2.8.0 aarch64 wheels are CPU builds, so
# PyPI offers no aarch64 cell of torch 2.8 (issue 39, measured). PyTorch's cu128+ channels publish both platforms.
PYPI_AARCH64_CUDA_FROM = Version("2.9.0")


def pypi_has_cuda_wheels(index_name: str, torch: str, platform: str) -> bool:
    """Whether ``index_name`` publishes a CUDA wheel of torch ``torch`` for ``platform`` (channels: always)."""
    return not (index_name == "pypi" and platform == "aarch64" and Version(torch) < PYPI_AARCH64_CUDA_FROM)


@dataclass(frozen=True)
class WheelFacts:
    """What a package's wheels (versions ``versions``) require beyond the torch pin finalize writes: upstream's
    Requires-Python and the Requires-Dist lines that constrain what torch brings (triton), with where each was read."""

    package: str
    versions: SpecifierSet
    requires_python: SpecifierSet
    requires: tuple[str, ...]
    source: str


WHEEL_FACTS: tuple[WheelFacts, ...] = (
    WheelFacts("causal-conv1d", SpecifierSet(">=1.5.2,<=1.7.0"), SpecifierSet(">=3.9"), (),
               "setup.py: python_requires >=3.9; install_requires torch, packaging, ninja (the recipe drops the "
               "last two)"),
    WheelFacts("mamba-ssm", SpecifierSet("==2.3.2.post1"), SpecifierSet(">=3.9"), ("triton>=3.5.0",),
               "Requires-Dist of the built wheel (docs/GPU-RESULTS.md section 7): triton>=3.5.0"),
    WheelFacts("mamba-ssm", SpecifierSet("==2.3.1"), SpecifierSet(">=3.9"), ("triton",),
               "mamba_ssm-2.3.1 sdist PKG-INFO: Requires-Python >=3.9; Requires-Dist triton (no version)"),
    WheelFacts("fla-core", SpecifierSet("==0.6.0"), SpecifierSet(">=3.10"), (),
               "fla-core 0.6.0 METADATA: Requires-Python >=3.10 (triton>=3.3 from the recipe's [runtime])"),
    WheelFacts("flash-linear-attention", SpecifierSet("==0.6.0"), SpecifierSet(">=3.10"), (),
               "flash-linear-attention 0.6.0 METADATA: Requires-Python >=3.10"),
)


def wheel_facts(package: str, version: str) -> WheelFacts | None:
    """The recorded facts of ``package`` ``version``; None where none are recorded."""
    name = canonicalize_name(package)
    return next((f for f in WHEEL_FACTS if canonicalize_name(f.package) == name
                 and f.versions.contains(Version(version), prereleases=True)), None)


def minor_releases(minor: str) -> list[str]:
    """The releases of torch minor ``minor`` (``2.8``) ``TORCH_TRITON`` records, oldest first."""
    return sorted((r for r in TORCH_TRITON if "{}.{}".format(*Version(r).release[:2]) == minor), key=Version)


def triton_reason(package: str, requires: tuple[str, ...], releases: tuple[str, ...] | list[str]) -> str | None:
    """The one triton check (farm/proven.py's installability, farm/coverage.py's reason a cell is not served, which
    ``builder matrix --details`` prints): why a wheel of ``package`` whose requirements are ``requires`` (the
    recorded Requires-Dist of ``WHEEL_FACTS`` and the recipe's [runtime] requires) cannot be installed beside one
    of ``releases`` without changing torch: the release pins a triton its triton requirement refuses
    (``torch 2.8.0 pins triton 3.4.0: mamba-ssm requires triton>=3.5.0``), or the pin is not recorded. None: no
    triton requirement, or every release's pin admits it."""
    tritons = [Requirement(r) for r in requires if canonicalize_name(Requirement(r).name) == "triton"]
    if not tritons:
        return None
    for release in sorted(releases, key=Version):
        pin = TORCH_TRITON.get(release)
        if pin is None:
            return f"torch {release}: its triton pin is not recorded (farm/facts.py TORCH_TRITON)"
        for req in tritons:
            if not req.specifier.contains(pin, prereleases=True):
                return f"torch {release} pins triton {pin}: {package} requires {req}"
    return None
