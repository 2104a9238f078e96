"""Facts the installability check of the farm (farm/proven.py) reads beside the users' matrix: which triton each
torch release pins, and what each package's wheels require beyond torch (upstream's Requires-Python and the run-time
requirements that constrain what comes with torch).

Which CUDA each torch release has on each platform is not kept here: discovery/torchindex.py reads it from each
release's wheels (``Release.cuda_on``). The triton pins are read the same way (``PlatformFacts.triton``, the
``triton==X`` line of the x86_64 wheel's METADATA, PyPI's and PyTorch's channels' builds of one release pin the same
triton): ``torch_triton`` derives them from the shipped snapshot (``builder torch-table --write-snapshot``). A
release whose pin was not read makes its cells "triton pin of torch X not recorded" (not installable, reason
shown), never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.discovery.torchindex import PYPI_SIMPLE, load_snapshot


@cache
def torch_triton() -> dict[str, str]:
    """torch release → the triton its Linux x86_64 wheels pin, read from their METADATA (the shipped snapshot of
    PyPI's torch releases, each read through PEP 658 or a range read of the wheel, its URL and sha256 kept there)."""
    listing = load_snapshot().get(PYPI_SIMPLE)
    pins: dict[str, str] = {}
    for release in listing.releases if listing else ():
        facts = release.on("x86_64")
        if facts is not None and facts.triton:
            pins[release.version] = facts.triton
    return pins


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
    WheelFacts("flash-attn", SpecifierSet(">=2.8.3,<=2.8.3.post2"), SpecifierSet(">=3.9"), (),
               "flash_attn-2.8.3.post2 sdist PKG-INFO: Requires-Python >=3.9; Requires-Dist torch, einops (pure "
               "Python, no torch pin)"),
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
    """The releases of torch minor ``minor`` (``2.8``) whose triton pin was read (``torch_triton``), oldest first."""
    return sorted((r for r in torch_triton() if "{}.{}".format(*Version(r).release[:2]) == minor), key=Version)


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
        pin = torch_triton().get(release)
        if pin is None:
            return f"torch {release}: its triton pin was not read (not in the torch snapshot)"
        for req in tritons:
            if not req.specifier.contains(pin, prereleases=True):
                return f"torch {release} pins triton {pin}: {package} requires {req}"
    return None
