"""`builder variants`: the PEP 825 variants of wheels already built (published or staged), without compiling.

For a wheel built before `--variants` (or an unchanged build that found it published), each arch of its record
becomes a thin wheel (stages/slicing.py), inspected like a build's and staged: `builder test` on a GPU that runs
it kernel-tests it and promotes it beside its plain wheel (the wheelhouse publishes a variant only where its plain
wheel is)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.core.errors import UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.wheelfile import parse_wheel_name, split_label
from builder.index.store import Wheelhouse
from builder.model.arch import Arch, parse_arch_list
from builder.model.builtwheel import BuiltWheel
from builder.model.variants import Variant
from builder.pipeline import checks
from builder.pipeline.chain import Checked, run_chain
from builder.pipeline.promote import resolve_wheels
from builder.stages.slicing import make_variant, one_arch_note, variant_record


def stage_variants(spec: str, settings: Settings, archs: str | None = None) -> list[Path]:
    """Stage the variants of the wheels ``spec`` names (a file, or a package's wheels in staging, else published);
    ``archs`` narrows them (default: every arch the wheel's record names). A wheel of one arch gets none, and a
    line saying so (stages/slicing.one_arch_note)."""
    house = Wheelhouse(settings.wheelhouse)
    staging = house.staging()
    staged, plain = [], _plain_wheels(spec, house)
    for path in plain:
        wheel = checks.read_wheel(path, house)
        if wheel.record is None or not wheel.archs or wheel.cuda is None:
            raise UsageError(f"{path.name}: no build record naming its archs and CUDA",
                             "variants are made of CUDA wheels this builder built")
        chosen = _archs(wheel, archs)
        if (note := one_arch_note(path.name, wheel.archs)) is not None:
            log.info(note)
            continue
        for arch in chosen:
            staged.append(_stage_one(wheel, Variant.for_build(arch, wheel.cuda), staging, settings))
    if not plain:
        raise UsageError(f"{spec}: no plain CUDA wheel to make variants of")
    return staged


def _plain_wheels(spec: str, house: Wheelhouse) -> list[Path]:
    """The plain wheels ``spec`` names: a file, or a package's in staging and published (staging's copy first)."""
    if Path(spec).suffix == ".whl" or Path(spec).is_file():
        return [w for w in resolve_wheels(spec, house) if split_label(w.name)[1] is None]
    found: dict[str, Path] = {}
    for area in (house.staging(), house):
        for wheel in sorted(area.wheels.glob("*.whl")) if area.wheels.is_dir() else []:
            if split_label(wheel.name)[1] is None and parse_wheel_name(wheel.name)[0] == canonicalize_name(spec):
                found.setdefault(wheel.name, wheel)
    return list(found.values())


def _archs(wheel: BuiltWheel, wanted: str | None) -> list[Arch]:
    have = sorted({Arch(a.number, a.suffix) for a in wheel.archs})
    if wanted is None:
        return have
    chosen = sorted({Arch(a.number, a.suffix) for a in parse_arch_list(wanted)})
    missing = [str(a) for a in chosen if a not in have]
    if missing:
        raise UsageError(f"--arch {wanted}: {wheel.path.name} was built for {', '.join(map(str, have))}, not "
                         f"{', '.join(missing)}",
                         "a variant is sliced from the plain wheel's own code: build it with that arch first")
    return chosen


def _stage_one(wheel: BuiltWheel, variant: Variant, staging: Wheelhouse, settings: Settings) -> Path:
    """One variant made, through the check chain's inspect (its one arch, the plain wheel's CPU platform) and
    publish (into staging)."""
    assert wheel.record is not None
    with tempfile.TemporaryDirectory(prefix="variants-", dir=settings.cache("tests")) as tmp:
        plain = wheel.record.with_(tests=None, timings=None, compiler_cache=None, parallel=None, gpu_tests=None)
        record = variant_record(plain, variant)
        made = BuiltWheel.made(make_variant(wheel.path, variant, Path(tmp)), record)

        def inspect(state: Checked) -> None:
            state.report = checks.inspect(state.wheel, settings, show=False, nothing="nothing was staged")

        def publish(state: Checked) -> None:  # staged: `builder test` on a GPU runs the rest of the chain
            assert state.report is not None
            grown = record.with_(inspect=state.report.as_dict(), wheel=state.wheel.path.name)
            state.published = checks.publish(staging, state.wheel.with_record(grown), state.report)

        staged = run_chain(Checked(made), {"inspect": inspect, "publish": publish}, announce=False).published
        assert staged is not None
    size, full = staged.stat().st_size, wheel.path.stat().st_size
    log.ok(f"staged the {variant.label} variant: {staged.name}, {size / 2**20:.1f} MiB ({size / full:.0%} of "
           f"{wheel.path.name}), {variant.arch.sm} only; `builder test` on a GPU that runs it promotes it")
    return staged
