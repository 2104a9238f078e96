"""`builder verify`: a torch released after a wheel offered across torches was built is one check, not a rebuild.

For each such wheel of a package in the wheelhouse (a stable-ABI wheel, or a pure-Python wheel built once), the
torches its range now holds (stages/torchrange.py: the newest release of each torch minor it claims, on the torch
index it was built with and, for the (torch minor, CUDA line) pairs that index lacks, on the other known indexes:
torchrange.py ``other_index_torches``) that its record has no passed check for are tried beside it; the new checks
go into its record, and the index then lists it in the channel of each torch that passed (one transaction:
index/store.py write_record). A stable wheel claims its port's range on its CUDA major; a pure-Python wheel every
torch its own requirement admits on every CUDA line from 12.8 on (torchrange.py ``PurePython``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.wheelfile import parse_wheel_name
from builder.discovery.compat import TorchIndex, resolve_index
from builder.index.store import Wheelhouse
from builder.model.platform import Platform, parse_platform
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.model.records import BuildRecord, TorchCheck
from builder.stages.finalize import read_metadata
from builder.stages.pyenv import find_interpreter, index_args
from builder.stages.torchrange import (
    IMPORT_REGISTRATION,
    Claim,
    MakeEnv,
    PurePython,
    built_once,
    cached_torches,
    check_torch_range,
    describe_checks,
    offline_maker,
    other_index_torches,
    read_here,
    split_unchecked,
    torch_names,
    torches_to_check,
    venv_maker,
)
from builder.toolchain import cross


@dataclass(frozen=True)
class Verified:
    wheel: str
    new: tuple[TorchCheck, ...]  # the checks run now
    checks: tuple[TorchCheck, ...]  # all of them, as the record now holds them


def ranged(filename: str, record: BuildRecord | None) -> bool:
    """Whether a published wheel is offered across torches by its checks: stable-ABI, or pure Python built once."""
    return record is not None and (record.is_stable_abi or built_once(filename))


def stable_packages(settings: Settings) -> list[str]:
    """The packages that have a published wheel offered across torches (stable-ABI, or pure Python built once)."""
    house = Wheelhouse(settings.wheelhouse)
    return sorted({str(parse_wheel_name(w.name)[0]) for w in house.wheel_files() if ranged(w.name, house.record_of(w.name))})


def verify_package(package: str, settings: Settings, *, python: str = "3.12", pre: bool = False) -> list[Verified]:
    """Check every published stable-ABI or built-once pure-Python wheel of ``package`` on the torches it has no
    passed check for. The wheel's torch index is read now (not its cached list: a torch released an hour ago
    counts), pre-releases included with ``pre``; what its newest torch is, and when it was uploaded, is said for
    each wheel, so a new torch day shows either the new check or why there is none."""
    house = Wheelhouse(settings.wheelhouse)
    wanted = canonicalize_name(package)
    wheels = [w for w in house.wheel_files() if canonicalize_name(parse_wheel_name(w.name)[0]) == wanted]
    found = [(w, r) for w in wheels if (r := house.record_of(w.name)) is not None and ranged(w.name, r)]
    if not found:
        raise UsageError(f"no stable-ABI or built-once pure-Python wheel of {package} in {house.wheels}",
                         "build one first (builder build with a recipe that has [stable-abi], or a pure-Python one)")
    recipe = load_recipe(find_recipe(package, settings.recipes_dir), settings.patches_dir)
    results = []
    for wheel, record in found:
        claim = _claim(wheel, record, recipe)
        index = resolve_index(record.torch_index or None, settings, pre=pre, refresh=not settings.offline)
        cuda = record.cuda_version
        if cuda is None:
            log.warning(f"{wheel.name}: its record names no CUDA; skipped")
            continue
        done = {(Version(c.torch).public, c.cuda, c.how) for c in record.torch_checks or () if c.passed}
        own = torches_to_check(index, cuda, claim)
        others = other_index_torches(index, cuda, claim, own, settings)
        rounds = [(index, own), *(others if settings.offline else read_here(others))]
        rounds = [(i, [(t, line) for t, line in these if (Version(t).public, line, IMPORT_REGISTRATION) not in done])
                  for i, these in rounds]
        log.info(f"{wheel.name}: {newest_torch_note(index, pre)}")
        if not any(these for _, these in rounds):
            log.ok(f"{wheel.name}: nothing new to verify ({describe_checks(record.torch_checks or ())})")
            results.append(Verified(wheel.name, (), tuple(record.torch_checks or ())))
            continue
        workdir = settings.cache("tests") / f"verify-{wheel.stem}"
        target = parse_platform(record.target_platform)  # another CPU's wheel: its Python under qemu
        new: tuple[TorchCheck, ...] = ()
        for each, todo in rounds:
            if not todo:
                continue
            base = find_interpreter(python) if not cross.is_cross(target) else Path()
            new += check_torch_range(wheel, claim, recipe.imports, todo, each, base, workdir,
                                     make_env=_env_maker(wheel, claim, recipe, each, base, target, house, settings,
                                                         python))
        made, unchecked = split_unchecked(new)
        replaced = {(Version(c.torch).public, c.cuda, c.how) for c in made}
        kept = tuple(c for c in record.torch_checks or () if (Version(c.torch).public, c.cuda, c.how) not in replaced)
        checks = (*kept, *made)
        tried = {(Version(c.torch).public, c.cuda) for c in new}  # a torch not checked before and now: replaced
        still = (*(c for c in record.torch_unchecked or () if (Version(c.torch).public, c.cuda) not in tried),
                 *unchecked)
        if unchecked:
            log.warning(f"{wheel.name}: --offline: not checked on torch {torch_names(unchecked)} "
                        "(not on this machine without the network); run `builder verify` where it has the network")
        house.write_record(wheel.name, record.with_(torch_checks=checks, torch_unchecked=still or None))
        log.ok(f"{wheel.name}: {describe_checks(checks)}; channels: {', '.join(house.channels_of(wheel.name))}")
        results.append(Verified(wheel.name, new, (*checks, *unchecked)))
    return results


def newest_torch_note(index: TorchIndex, pre: bool) -> str:
    """What the index's newest torch is and whether the next minor is there: "pypi's newest torch is 2.15.0
    (uploaded 2026-10-28; list read from https://pypi.org/simple at …); no torch 2.16 release or pre-release is on
    it". Read from the listing, so it names the next minor the day it appears, with no change here."""
    listing = index.listing
    releases = listing.releases if listing is not None else ()
    if not releases:
        return f"{index.name} lists no torch ({listing.note if listing is not None else 'not read'})"
    newest = max(releases, key=lambda r: Version(r.version))
    version = Version(newest.version)
    uploaded = f"uploaded {newest.uploaded[:10]}" if newest.uploaded else "upload time not served"
    read = (f"list read from {index.url} at {listing.read_at}" if listing is not None and listing.source == "index"
            else f"list from the {index.source} of {listing.read_at if listing is not None else '?'}, not read now")
    kind = " (a pre-release)" if version.is_prerelease else ""
    following = f"{version.major}.{version.minor + 1}"
    absent = (f"no torch {following} release or pre-release is on it" if pre else
              f"no torch {following} release is on it (pre-releases not looked at: --pre)")
    return f"{index.name}'s newest torch is {newest.version}{kind} ({uploaded}; {read}); {absent}"


def _claim(wheel: Path, record: BuildRecord, recipe: Recipe) -> Claim:
    """What the wheel claims: its recipe's stable-ABI port, or (pure Python) its own torch requirement."""
    if not record.is_stable_abi:
        requires = [line.split(":", 1)[1].strip() for line in read_metadata(wheel).splitlines()
                    if line.startswith("Requires-Dist:")]
        return PurePython.of_requires(requires)
    if recipe.stable_abi is None:
        raise UsageError(f"the recipe of {recipe.name} has no [stable-abi] section", "add it, or rebuild per torch")
    return recipe.stable_abi


def _env_maker(wheel: Path, claim: Claim, recipe: Recipe, index: TorchIndex, base: Path, target: Platform,
               house: Wheelhouse, settings: Settings, python: str) -> MakeEnv | None:
    """A cross wheel's env under qemu; offline, one made from this machine's caches (torchrange.offline_maker:
    cached build venvs of ``python``, uv's cache); a pure-Python wheel's with its companions (the wheelhouse's
    wheels) and the recipe's test requirements; None (torchrange's default venv) for a stable wheel of this
    machine."""
    if cross.is_cross(target):
        return cross.env_maker(target, wheel, index_args(index), settings)
    if settings.offline:
        pure = isinstance(claim, PurePython)
        return offline_maker(wheel, index, base, cached_torches(settings.cache("venvs"), python),
                             extra=recipe.test_requires if pure else (), find_links=house.wheels if pure else None)
    if isinstance(claim, PurePython):
        return venv_maker(wheel, index, base, extra=recipe.test_requires, find_links=house.wheels)
    return None
