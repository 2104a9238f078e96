"""`builder verify`: a torch released after a wheel offered across torches was built is one check, not a rebuild.

For each such wheel of a package in the wheelhouse (a stable-ABI wheel, or a pure-Python wheel built once), the
torches its range now holds (stages/torchrange.py: the newest release of each torch minor it claims, on the torch
index it was built with and, for the (torch minor, CUDA line) pairs that index lacks, on the other known indexes:
torchrange.py ``other_index_torches``) that its record has no passed check for are tried beside it; the new checks
go into its record, and the index then lists it in the channel of each torch that passed (one transaction:
index/store.py write_record). A stable wheel claims its port's range on its CUDA major; a pure-Python wheel every
torch its own requirement admits on every CUDA line from 12.8 on (torchrange.py ``PurePython``).

An index that cannot be reached is no result (issue 54): when the wheel's index cannot be read now (a cached list
would answer), or uv's install of a torch fails on the network (HTTP 5xx, refused, timed out, DNS), the command
stops with ``Unreachable`` (exit 4) naming the index and the cause; those torches are not recorded as failed checks,
so the record says only what was actually tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import SourceError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.wheelfile import parse_wheel_name, superseded
from builder.discovery.compat import TorchIndex, resolve_index
from builder.discovery.simpleindex import reading
from builder.discovery.torchindex import unreadable_why
from builder.index.store import Wheelhouse
from builder.model.builtwheel import BuiltWheel
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.model.recordmerge import merge_checks
from builder.model.records import TorchCheck
from builder.model.wheelfacts import Wheel
from builder.pipeline import checks
from builder.pipeline.chain import Checked, run_chain
from builder.stages.pyenv import find_interpreter
from builder.stages.torchrange import (
    IMPORT_REGISTRATION,
    PurePython,
    cached_torches,
    check_torch_range,
    describe_checks,
    other_index_torches,
    read_here,
    split_unchecked,
    torch_names,
    torches_to_check,
)
from builder.toolchain import cross


class Unreachable(SourceError):
    """A torch index this verification needs could not be reached: nothing is recorded for what it would decide."""


# uv's words for a network failure (its install of a torch never reached a verdict on the wheel)
_UV_NETWORK = ("error sending request", "HTTP status server error", "dns error", "tcp connect error",
               "Connection refused", "operation timed out", "failed to lookup address", "Service Unavailable")


def network_failure(check: TorchCheck) -> bool:
    """A failed check whose detail is uv failing to reach the index, not the wheel failing beside the torch."""
    return check.status == "failed" and any(w in check.detail for w in _UV_NETWORK)


@dataclass(frozen=True)
class Verified:
    wheel: str
    new: tuple[TorchCheck, ...]  # the checks run now
    checks: tuple[TorchCheck, ...]  # all of them, as the record now holds them


def stable_packages(settings: Settings) -> list[str]:
    """The packages that have a published wheel offered across torches (stable-ABI, or pure Python built once)."""
    house = _house(settings)
    return sorted({str(w.name) for w in _ranged(house)})


def _house(settings: Settings) -> Wheelhouse:
    """The wheelhouse to verify, refused when it is not a folder (before: read as empty, "nothing to verify", exit
    0, for a mistyped --wheelhouse)."""
    root = settings.wheelhouse
    if not root.is_dir():
        raise UsageError(f"verify: --wheelhouse {root} is {'a file' if root.exists() else 'not there'}, not a "
                         "wheelhouse folder", "give the folder `builder build` publishes into (it holds wheels/ "
                         "and simple/), or set BUILDER_WHEELHOUSE")
    return Wheelhouse(root)


def _ranged(house: Wheelhouse) -> list[BuiltWheel]:
    """The wheels offered by their torch checks that have a record to add checks to."""
    return [w for path in house.wheel_files()
            if (w := BuiltWheel.made(path, house.record_of(path.name))).ranged and w.record is not None]


def verify_package(package: str, settings: Settings, *, python: str = "3.12", pre: bool = False) -> list[Verified]:
    """Check every published stable-ABI or built-once pure-Python wheel of ``package`` on the torches it has no
    passed check for (the check chain's claim → torch_range). The wheel's torch index is read now (not its cached
    list: a torch released an hour ago counts), pre-releases included with ``pre``; what its newest torch is, and
    when it was uploaded, is said for each wheel, so a new torch day shows either the new check or why there is
    none."""
    house = _house(settings)
    found = [w for w in _ranged(house) if w.name == canonicalize_name(package)]
    if not found:
        raise UsageError(f"no stable-ABI or built-once pure-Python wheel of {package} in {house.wheels}",
                         "build one first (builder build with a recipe that has [stable-abi], or a pure-Python one)")
    recipe = load_recipe(find_recipe(package, settings.recipes_dir), settings.patches_dir)
    for line in superseded_lines(house, recipe):
        log.warning(line)
    done: list[Verified] = []
    outages: list[Unreachable] = []
    for wheel in found:  # an unreachable index stops no other wheel's verification; it fails the command at the end
        try:
            with reading():  # the wheel's index reads (its own and the others) share one network deadline
                verified = _verify_one(wheel, recipe, house, settings, python, pre)
        except Unreachable as e:
            outages.append(e)
            continue
        if verified is not None:
            done.append(verified)
    if outages:
        for other in outages[1:]:
            log.warning(other.one_line())
        more = f" ({len(outages) - 1} more wheels likewise, above)" if len(outages) > 1 else ""
        raise Unreachable(outages[0].message + more, outages[0].hint)
    return done


def superseded_lines(house: Wheelhouse, recipe: Recipe) -> list[str]:
    """One line per published wheel of ``recipe`` that a newer build supersedes (docs/INDEX.md "Superseded
    builds"): a newer build of the same file in the wheelhouse (whose pages mark it yanked), or a fix patch of the
    recipe that no published wheel of that version carries yet (then the version needs a rebuild)."""
    files = [p.name for p in house.wheel_files()
             if canonicalize_name(parse_wheel_name(p.name)[0]) == canonicalize_name(recipe.name)]
    newer = superseded(files)
    lines = []
    for filename in files:
        wheel = Wheel.named(filename)
        version, build = wheel.version, wheel.build
        record = house.record_of(filename)
        made, why = recipe.build_of(version, record.abi if record else None)
        if filename in newer:
            lines.append(f"{filename}: build {build} is superseded by {newer[filename]} (its pages mark it yanked); "
                         f"an env that installed it: builder install {recipe.name} reinstalls the new build")
        elif made > build:
            lines.append(f"{recipe.name} {version} build {build} ({filename}) is superseded by build {made} ({why}): "
                         f"rebuild it (builder build {recipe.name} --version {version.public} …), then builder "
                         f"install {recipe.name} in the envs that have it")
    return lines


def _verify_one(wheel: BuiltWheel, recipe: Recipe, house: Wheelhouse, settings: Settings, python: str,
                pre: bool) -> Verified | None:
    record, path = wheel.record, wheel.path
    assert record is not None  # a ranged wheel has one
    claim = checks.claim(wheel, recipe)
    index = resolve_index(record.torch_index or None, settings, pre=pre, refresh=not settings.offline)
    listing = index.listing
    if not settings.offline and listing is not None and listing.source != "index":
        why = unreadable_why(settings, index.url, pre) or listing.note or "not read"
        raise Unreachable(f"{path.name}: its torch index {index.url} cannot be read now ({why}); nothing was checked "
                          "or recorded", "run `builder verify` again when the index answers (or --offline to check "
                          "only the torches this machine has)")
    if wheel.cuda is None:
        log.warning(f"{path.name}: its record names no CUDA; skipped")
        return None
    done = {c.key for c in record.torch_checks or () if c.passed}
    own = torches_to_check(index, wheel.cuda, claim)
    others = other_index_torches(index, wheel.cuda, claim, own, settings)
    rounds = [(index, own), *(others if settings.offline else read_here(others))]
    rounds = [(i, [(t, line) for t, line in these if _key(t, line) not in done]) for i, these in rounds]
    log.info(f"{path.name}: {newest_torch_note(index, pre)}")
    if not any(these for _, these in rounds):
        log.ok(f"{path.name}: nothing new to verify ({describe_checks(record.torch_checks or ())})")
        return Verified(path.name, (), tuple(record.torch_checks or ()))
    workdir = settings.cache("tests") / f"verify-{path.stem}"
    here = cached_torches(settings.cache("venvs"), python) if settings.offline else []  # offline: torches to borrow

    def torch_range(state: Checked) -> None:  # the new rounds' checks, before any is merged
        for each, todo in rounds:
            if not todo:
                continue
            base = find_interpreter(python) if not cross.is_cross(wheel.platform) else Path()
            make_env = checks.range_env_maker(path, each, base, settings, pure=isinstance(claim, PurePython),
                                              test_requires=recipe.test_requires, companions=house.wheels,
                                              here=here,
                                              cross_platform=wheel.platform if cross.is_cross(wheel.platform) else None)
            state.torch_checks += check_torch_range(path, claim, recipe.imports, todo, each, base, workdir,
                                                    make_env=make_env)

    verified: list[Verified] = []
    run_chain(Checked(wheel, record=record), {"torch range": torch_range,
                                              "publish": lambda state: verified.append(_record_new(state, house))},
              announce=False)
    return verified[0]


def _record_new(state: Checked, house: Wheelhouse) -> Verified:
    """``builder verify``'s publish step: the new checks merged into the wheel's record by the one rule
    (model/recordmerge.py), the channels rebuilt; an index outage is no check, and says so."""
    path, record, new = state.wheel.path, state.record, state.torch_checks
    assert record is not None
    outage = [c for c in new if network_failure(c)]
    new = tuple(c for c in new if c not in outage)
    made, unchecked = split_unchecked(new)
    checks_now = merge_checks(record.torch_checks or (), made)  # the one rule (model/recordmerge.py)
    tried = {c.key[:2] for c in new}  # a torch not checked before and now: replaced
    still = (*(c for c in record.torch_unchecked or () if c.key[:2] not in tried), *unchecked)
    if unchecked:
        log.warning(f"{path.name}: --offline: not checked on torch {torch_names(unchecked)} "
                    "(not on this machine without the network); run `builder verify` where it has the network")
    if new:
        house.write_record(path.name, record.with_(torch_checks=checks_now, torch_unchecked=still or None))
    if outage:
        cause = outage[0].detail.split(" failed: ", 1)[-1]
        raise Unreachable(f"{path.name}: torch {torch_names(tuple(outage))} could not be installed, its index "
                          f"unreachable or failing (uv: {cause if len(cause) <= 240 else '…' + cause[-240:]}); "
                          "not recorded as a check"
                          + (f", the {len(new)} other checks recorded" if new else ""),
                          "run `builder verify` again when the index answers")
    log.ok(f"{path.name}: {describe_checks(checks_now)}; channels: {', '.join(house.channels_of(path.name))}")
    return Verified(path.name, new, (*checks_now, *unchecked))


def _key(torch: str, line: str) -> tuple[Version, str, str]:
    """The key (TorchCheck.key) a check of ``torch`` on CUDA ``line`` by import would have."""
    return TorchCheck(torch=torch, cuda=line, python="", how=IMPORT_REGISTRATION, status="").key


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
