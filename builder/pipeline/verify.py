"""`builder verify`: a torch released after a stable-ABI wheel was built is one check, not a rebuild.

For each stable-ABI wheel of a package in the wheelhouse, the torches its range now holds (stages/torchrange.py:
the newest release of each torch minor from the floor on, for the wheel's CUDA major, on the torch index it was
built with and, for the (torch minor, CUDA line) pairs that index lacks, on the other known indexes: torchrange.py
``other_index_torches``) that its record has no passed check for are tried beside it; the new checks go into its record, and the
index then lists it in the channel of each torch that passed (one transaction: index/store.py write_record).
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
from builder.discovery.compat import resolve_index
from builder.index.store import Wheelhouse
from builder.model.platform import parse_platform
from builder.model.recipe import find_recipe, load_recipe
from builder.model.records import TorchCheck
from builder.stages.pyenv import find_interpreter, index_args
from builder.stages.torchrange import check_torch_range, describe_checks, other_index_torches, torches_to_check
from builder.toolchain import cross


@dataclass(frozen=True)
class Verified:
    wheel: str
    new: tuple[TorchCheck, ...]  # the checks run now
    checks: tuple[TorchCheck, ...]  # all of them, as the record now holds them


def stable_packages(settings: Settings) -> list[str]:
    """The packages that have a published stable-ABI wheel."""
    house = Wheelhouse(settings.wheelhouse)
    return sorted({str(parse_wheel_name(w.name)[0]) for w in house.wheel_files()
                   if (r := house.record_of(w.name)) is not None and r.is_stable_abi})


def verify_package(package: str, settings: Settings, *, python: str = "3.12") -> list[Verified]:
    """Check every published stable-ABI wheel of ``package`` on the torches it has no passed check for."""
    house = Wheelhouse(settings.wheelhouse)
    wanted = canonicalize_name(package)
    wheels = [w for w in house.wheel_files() if canonicalize_name(parse_wheel_name(w.name)[0]) == wanted]
    stable = [(w, r) for w in wheels if (r := house.record_of(w.name)) is not None and r.is_stable_abi]
    if not stable:
        raise UsageError(f"no stable-ABI wheel of {package} in {house.wheels}",
                         "build one first (builder build with a recipe that has [stable-abi])")
    recipe = load_recipe(find_recipe(package, settings.recipes_dir), settings.patches_dir)
    if recipe.stable_abi is None:
        raise UsageError(f"the recipe of {package} has no [stable-abi] section", "add it, or rebuild per torch")
    results = []
    for wheel, record in stable:
        index, cuda = resolve_index(record.torch_index or None, settings), record.cuda_version
        if cuda is None:
            log.warning(f"{wheel.name}: its record names no CUDA; skipped")
            continue
        done = {(Version(c.torch).public, c.cuda, c.how) for c in record.torch_checks or () if c.passed}
        own = torches_to_check(index, cuda, recipe.stable_abi)
        rounds = [(index, own), *other_index_torches(index, cuda, recipe.stable_abi, own, settings)]
        rounds = [(i, [(t, line) for t, line in these if (Version(t).public, line, "import+registration") not in done])
                  for i, these in rounds]
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
            make_env = cross.env_maker(target, wheel, index_args(each), settings) if cross.is_cross(target) else None
            new += check_torch_range(wheel, recipe.stable_abi, recipe.imports, todo, each,
                                     find_interpreter(python) if make_env is None else Path(), workdir,
                                     make_env=make_env)
        replaced = {(Version(c.torch).public, c.cuda, c.how) for c in new}
        kept = tuple(c for c in record.torch_checks or () if (Version(c.torch).public, c.cuda, c.how) not in replaced)
        checks = (*kept, *new)
        house.write_record(wheel.name, record.with_(torch_checks=checks))
        log.ok(f"{wheel.name}: {describe_checks(checks)}; channels: {', '.join(house.channels_of(wheel.name))}")
        results.append(Verified(wheel.name, new, checks))
    return results
