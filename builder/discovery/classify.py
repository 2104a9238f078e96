"""What one torch release's wheels are, read from the wheels themselves (discovery/torchindex.py keeps the lists):
the CUDA each Linux platform's wheels carry, from a ``+cu128`` label, else from the Requires-Dist of one wheel's
METADATA as it applies on that platform (PEP 658, else a range read of the wheel), and where those pin no CUDA, from
the wheel's ``torch/version.py``; the Pythons of its wheel names; the triton it pins."""

from __future__ import annotations

import re
import urllib.error
import zipfile
from collections.abc import Iterable
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.core.errors import SourceError
from builder.discovery.simpleindex import WheelFile, wheel_member, wheel_metadata
from builder.discovery.torchfacts import PlatformFacts, Release
from builder.model.cuda import CudaVersion
from builder.model.platform import of_wheel_platform

# Requirements that name the CUDA runtime a torch wheel was built with.
_CUDA_PINS = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12",
              "nvidia-cuda-runtime-cu13")


def cuda_from_label(version: str) -> str | None:
    """``2.11.0+cu128`` → ``12.8``; ``+cpu`` → ``cpu``; no label → None."""
    local = Version(version).local
    if local is None:
        return None
    if local == "cpu":
        return "cpu"
    cuda = CudaVersion.from_flavour(local)
    return cuda.line if cuda else None


def cuda_from_requirements(requires: Iterable[str]) -> tuple[str, str]:
    """(cuda, evidence) from a wheel's Requires-Dist lines; no CUDA pin → ("cpu", ...)."""
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) not in _CUDA_PINS:
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "===", "~="):
                try:
                    v = Version(spec.version.rstrip(".*"))
                except InvalidVersion:
                    continue
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras and len(req.extras) < 3 else (
                    "[...]" if req.extras else "")
                return CudaVersion.of(v).line, f"METADATA: {req.name}{extras}{spec}"
    return "cpu", "METADATA: no CUDA requirement"


def requires_dist(metadata: str) -> list[str]:
    return HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []


def python_of(filename: str) -> tuple[str, ...]:
    """``torch-2.15.0-cp312-cp312-manylinux...whl`` → ("3.12",); free-threaded cp313t → ("3.13t",)."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return ()
    out = set()
    for tag in tags:
        match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
        if match:
            out.add(f"{match.group(1)}.{match.group(2)}" + ("t" if tag.abi.endswith("t") else ""))
    return tuple(sorted(out))


def _linux_order(wheel: WheelFile) -> tuple[int, int, str]:
    """Linux x86_64 wheels first (the ones with CUDA requirements), cp312 first among them."""
    name = wheel.filename
    platform = 0 if "linux" in name and "x86_64" in name else 1 if "linux" in name else 2
    return platform, 0 if "-cp312-" in name else 1, name


def linux_platform(filename: str) -> str | None:
    """The Linux platform of a wheel (``manylinux_2_28_aarch64`` → aarch64); None for other systems."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    for tag in tags:
        found = of_wheel_platform(tag.platform) if "linux" in tag.platform else None
        if found is not None:
            return found.name
    return None


_LINUX = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython"}


def requirements_on(requires: Iterable[str], platform: str, python: str = "3.12") -> list[Requirement]:
    """The Requires-Dist lines that apply on Linux ``platform`` with CPython ``python`` and no extra: torch 2.9's
    ``nvidia-cuda-runtime-cu12==12.8.90; platform_machine == "x86_64"`` applies on x86_64, not on aarch64."""
    env = {**_LINUX, "platform_machine": platform, "python_version": python, "python_full_version": f"{python}.0",
           "extra": ""}
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def triton_pin(requires: Iterable[Requirement]) -> str | None:
    """``3.6.0`` from ``triton==3.6.0`` (``~=3.9.0`` → 3.9.0: the lowest release the pin admits)."""
    for req in requires:
        if canonicalize_name(req.name) != "triton":
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "~=", "==="):
                return spec.version.rstrip(".*")
    return None


_VERSION_PY_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(None|'([^']*)'|"([^"]*)")""", re.MULTILINE)


def cuda_of_version_py(text: str) -> str | None:
    """``cpu`` for ``cuda = None``, ``12.8`` for ``cuda: Optional[str] = '12.8'``; None where the file says neither."""
    match = _VERSION_PY_CUDA.search(text)
    if match is None:
        return None
    value = match.group(2) or match.group(3)
    if match.group(1) == "None" or not value:
        return "cpu"
    try:
        return CudaVersion.parse(value).line
    except (InvalidVersion, ValueError):
        return None


# SourceError: a file past its cap, a redirect refused (simpleindex.py); the release stays unread, with the reason
_READ_ERRORS = (OSError, urllib.error.URLError, zipfile.BadZipFile, StopIteration, UnicodeDecodeError, KeyError,
                SourceError)


def read_platform(platform: str, wheels: list[WheelFile], now: str) -> PlatformFacts:
    """One platform's facts from the METADATA of one of its wheels (cp312 first): the CUDA its requirements pin on
    that platform; where they pin none, ``torch/version.py`` of the same wheel says whether it is a CPU build or one
    with its CUDA inside (read by range requests)."""
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=python_sort))
    errors: list[str] = []
    for wheel in sorted(wheels, key=_linux_order)[:3]:
        try:
            text, how = wheel_metadata(wheel)
        except _READ_ERRORS as e:
            errors.append(f"{wheel.filename}: {e}")
            continue
        python = next(iter(python_of(wheel.filename)), "3.12").rstrip("t")
        applies = requirements_on(requires_dist(text), platform, python)
        cuda, evidence = cuda_from_requirements(str(r) for r in applies)
        if cuda == "cpu":
            cuda, evidence = _confirm_cpu(wheel, platform)
        return PlatformFacts(platform, cuda, pythons, f"{evidence} ({how}, {wheel.filename})", wheel.filename,
                             wheel.url, wheel.sha256, now, triton_pin(applies))
    return PlatformFacts(platform, None, pythons, "METADATA unreadable: " + "; ".join(errors)[:300], read_at=now)


def _confirm_cpu(wheel: WheelFile, platform: str) -> tuple[str, str]:
    """(cuda, evidence) of a wheel whose METADATA pins no CUDA on ``platform``: its ``torch/version.py`` decides."""
    said = f"METADATA: no CUDA requirement on {platform}"
    try:
        found = cuda_of_version_py(wheel_member(wheel, "torch/version.py"))
    except _READ_ERRORS as e:
        return "cpu", f"{said}; torch/version.py not read ({str(e)[:120]})"
    if found is None:
        return "cpu", f"{said}; torch/version.py names no cuda"
    return found, f"{said}; torch/version.py: cuda = {'None' if found == 'cpu' else repr(found)}"


def classify(version: str, wheels: list[WheelFile], now: str) -> Release:
    """One release's CUDA on each Linux platform it has wheels for: from its label, else from the METADATA of one
    wheel per platform (``read_platform``). The release's own ``cuda`` is its x86_64 wheels'."""
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=python_sort))
    public = str(Version(version).public)
    by_platform: dict[str, list[WheelFile]] = {}
    for wheel in wheels:
        platform = linux_platform(wheel.filename)
        if platform is not None:
            by_platform.setdefault(platform, []).append(wheel)
    labelled = cuda_from_label(version)
    if labelled is not None:
        label = f"+{Version(version).local} label"
        facts = tuple(_labelled(p, ws, labelled, label, now) for p, ws in sorted(by_platform.items()))
        return Release(public, labelled, pythons, label, now, platforms=facts)
    if not by_platform:
        return Release(public, None, pythons, "no Linux wheel", now)
    facts = tuple(read_platform(p, ws, now) for p, ws in sorted(by_platform.items()))
    main = next((f for f in facts if f.platform == "x86_64"), facts[0])
    return Release(public, main.cuda, pythons, main.evidence, now, platforms=facts)


def _labelled(platform: str, wheels: list[WheelFile], cuda: str, label: str, now: str) -> PlatformFacts:
    first = sorted(wheels, key=_linux_order)[0]
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=python_sort))
    return PlatformFacts(platform, cuda, pythons, f"{label} ({first.filename})", first.filename, first.url,
                         first.sha256, now)


def cuda_sort(cuda: str) -> tuple[int, Version]:
    return (1, Version(cuda)) if cuda[:1].isdigit() else (0, Version("0"))


def python_sort(python: str) -> tuple[Version, str]:
    return Version(python.rstrip("t")), python
