"""The check chain every built wheel goes through, one small function per stage, each callable alone:

    read_wheel → inspect → test (import, kernel tests) → torch_range (claim) → publish

``builder build`` (pipeline/run.py) runs it in that order on the wheel it just made; ``builder test``
(pipeline/promote.py) runs inspect and test on a staged or published wheel, ``builder verify`` (pipeline/verify.py)
claim and torch_range, ``builder variants`` (pipeline/builtvariants.py) inspect on each variant it makes. Each takes the
wheel as one BuiltWheel (model/builtwheel.py), whose facts (tags, CUDA, archs, ABI, torch, platform) were read once."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import Version

from builder.core.errors import InspectError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex
from builder.index.store import Wheelhouse
from builder.model.arch import Arch
from builder.model.builtwheel import BuiltWheel
from builder.model.platform import Platform
from builder.model.recipe import Recipe
from builder.model.recordmerge import merge_checks
from builder.model.records import BuildRecord, TestReport, TorchCheck
from builder.model.variants import Variant
from builder.model.wheelfacts import requires_dist
from builder.stages.finalize import read_build_record, read_metadata
from builder.stages.inspection import WheelReport, inspect_wheel, render_report, verify_archs, verify_platform
from builder.stages.plan import Plan
from builder.stages.pyenv import PythonEnv, fresh_test_env, index_args, probe
from builder.stages.slicing import make_variant, one_arch_note, variant_record
from builder.stages.testing import KernelTestPlan, TestStageFailed, run_tests
from builder.stages.torchrange import (
    GPU_KERNEL_TESTS,
    IMPORT_REGISTRATION,
    NOT_CHECKED,
    Claim,
    MakeEnv,
    PerTorch,
    PurePython,
    TorchHere,
    cached_torches,
    check_torch_range,
    describe_checks,
    offline_maker,
    other_index_torches,
    read_here,
    torch_names,
    torches_to_check,
    venv_maker,
)
from builder.toolchain import cross


def read_wheel(path: Path, house: Wheelhouse | None = None) -> BuiltWheel:
    """A wheel on disk as a BuiltWheel: its record from the wheelhouse (staging first: the newer one there), else
    the one finalize wrote inside it, else none (a wheel this builder did not build)."""
    record = None
    if house is not None:
        record = house.staging().record_of(path.name) if house.staging().contains(path) else None
        record = record or house.record_of(path.name)
    return BuiltWheel.made(path, record or read_build_record(path))


def inspect(wheel: BuiltWheel, settings: Settings, cuda_home: tuple[Path, ...] = (), *, verify: bool = True,
            show: bool = True, nothing: str = "nothing was published") -> WheelReport:
    """Which GPU code, CPU platform, libraries and (stable ABI) torch imports the wheel carries; with ``verify``,
    an InspectError (``nothing`` says what did not happen) where a CUDA wheel lacks one of its archs or is for
    another CPU, or a stable-ABI wheel still calls torch's C++ API."""
    report = inspect_wheel(wheel.path, settings, cuda_home)
    if show:
        log.info(render_report(report))
    if verify and wheel.archs:
        problems = verify_archs(report, wheel.archs) + verify_platform(report, wheel.platform)
        if problems:
            raise InspectError(("" if wheel.variant is None else f"variant {wheel.variant}: ")
                               + "GPU code check failed: " + "; ".join(problems), nothing)
        if show:
            log.ok(f"GPU code check passed: {', '.join(sorted(report.sass | report.ptx))}")
    if verify and wheel.stable:
        stable_problems = report.stable_abi.problems() if report.stable_abi else ["no stable-ABI report"]
        if stable_problems:
            raise InspectError("stable-ABI check failed: " + "; ".join(stable_problems),
                               f"{nothing}; the port still calls torch's C++ API somewhere")
        assert report.stable_abi is not None
        log.ok(f"stable-ABI check passed: no torch C++ imports, {len(report.stable_abi.shim_imports)} C shims, "
               f"abi3 tag, abi3audit {report.stable_abi.abi3audit}")
    if verify and report.limited_api is not None:  # a Python-agnostic per-torch wheel ([per-torch-abi3])
        limited_problems = report.limited_api.limited_api_problems()
        if limited_problems:
            raise InspectError("abi3 check failed: " + "; ".join(limited_problems),
                               f"{nothing}; the per-torch abi3 port still uses Python API outside the limited API")
        if show:
            log.ok(f"abi3 check passed (per torch): abi3 tag, abi3audit {report.limited_api.abi3audit}; "
                   f"{len(report.limited_api.torch_cxx_imports)} torch C++ imports, as a per-torch wheel may")
    return report


def claim(wheel: BuiltWheel, recipe: Recipe, requires: tuple[str, ...] | None = None) -> Claim:
    """The torches a wheel offered across torches claims: its recipe's stable-ABI port, a per-torch wheel's torch minor
    on the lines of its CUDA major, or (pure Python) its own torch requirement (``requires``: its Requires-Dist lines;
    read from the wheel where not given)."""
    if wheel.stable:
        if recipe.stable_abi is None:
            raise UsageError(f"the recipe of {recipe.name} has no [stable-abi] section", "add it, or rebuild per torch")
        # the wheel's own floor (its record's, what its Requires-Dist says: raised per CUDA major, model/abi.py)
        floor = wheel.torch_floor
        return replace(recipe.stable_abi, torch_floor=floor) if floor is not None else recipe.stable_abi
    label = wheel.facts.label
    if wheel.per_torch_major and label is not None and label.torch is not None:
        return PerTorch(label.torch)
    if requires is None:
        requires = requires_dist(read_metadata(wheel.path))
    return PurePython.of_requires(requires)


def publish(house: Wheelhouse, wheel: BuiltWheel, report: WheelReport, *, replace_other: bool = False) -> Path:
    """Into ``house`` (its pages and channels in one transaction: index/store.py), with the wheel's record."""
    assert wheel.record is not None
    return house.publish(wheel.path, wheel.record, replace=replace_other, portability=report.portability)


def torch_range(plan: Plan, settings: Settings, python: PythonEnv, base_python: Path, wheel: BuiltWheel,
                workdir: Path, tests: TestReport, *, whole_range: bool = True,
                cross_build: cross.CrossBuild | None = None, requires: tuple[str, ...] = (),
                companions: Path | None = None) -> tuple[TorchCheck, ...]:
    """A wheel offered across torches beside every torch minor it claims (stages/torchrange.py): a stable-ABI
    wheel's port range, a per-torch wheel's torch minor on the other lines of its CUDA major (cu129's 2.9.1 for a
    12.8 build), a pure-Python wheel's own torch requirement (``requires``: its Requires-Dist lines) on every CUDA
    line from 12.8 on. The build's own torch must pass (for a stable wheel it is tried again in a fresh venv; for
    the others the import test is that check); a failure on another torch only keeps the wheel out of that torch's
    channel, and says so."""
    claimed = claim(wheel, plan.recipe, requires)
    own = Version(python.torch or "0").public
    built = own_import_check(python, tests) if not plan.stable else None
    torches = torches_to_check(plan.index, plan.cuda, claimed)
    offline = settings.offline and cross_build is None
    if offline and python.torch and not any(Version(t).public == own for t, _ in torches):
        torches.append((str(own), ".".join((python.torch_cuda or str(plan.cuda)).split(".")[:2])))  # not listed
    if not whole_range or (settings.offline and not offline):
        why = ("--no-torch-range (builder install's default; its --torch-range checks the others)" if not whole_range
               else "--offline (a cross build)")
        log.warning(f"torch range: {why}, so only the build's torch is checked and the wheel is offered for it "
                    "alone until `builder verify` checks the others")
        torches = [(t, line) for t, line in torches if Version(t).public == own]
    if built is not None:  # the import test tried this one already
        torches = [(t, line) for t, line in torches if (Version(t).public, line) != (own, built.cuda)]
    rounds = [(plan.index, torches)]
    if whole_range and not settings.offline:  # the torches of the other indexes the wheel claims (cu130's 2.15)
        have = [*torches, *([(built.torch, built.cuda)] if built else [])]
        rounds += read_here(other_index_torches(plan.index, plan.cuda, claimed, have, settings))
    elif whole_range and offline:  # tried from this machine's caches; what they lack is NOT_CHECKED, not failed
        have = [*torches, *([(built.torch, built.cuda)] if built else [])]
        rounds += other_index_torches(plan.index, plan.cuda, claimed, have, settings)
    checks: tuple[TorchCheck, ...] = (built,) if built else ()
    base = base_python if python.managed else python.python
    here = [h for h in (TorchHere.of(python, "the build env"),) if h is not None]
    if offline:
        here += [h for h in cached_torches(settings.cache("venvs"), python.version)
                 if Version(h.torch).public != own]
    for index, these in rounds:
        if these:
            make_env = range_env_maker(wheel.path, index, base, settings, pure=plan.pure_python,
                                       test_requires=plan.recipe.test_requires, companions=companions, here=here,
                                       cross_platform=cross_build.platform if cross_build is not None else None)
            checks += check_torch_range(wheel.path, claimed, plan.recipe.imports, these, index, base, workdir,
                                        make_env=make_env)
    return _range_verdict(checks, python, tests)


def _range_verdict(checks: tuple[TorchCheck, ...], python: PythonEnv, tests: TestReport) -> tuple[TorchCheck, ...]:
    """The torch range's checks, if the build's own torch passed (else TestStageFailed: nothing is published), with
    what --offline could not check said."""
    own = Version(python.torch or "0").public
    own_line = ".".join((python.torch_cuda or "").split(".")[:2])

    def is_own(check: TorchCheck) -> bool:  # the build torch's check (the same release of another CUDA line is not)
        return Version(check.torch).public == own and (not own_line or check.cuda.startswith(own_line))

    if not any(c.passed and is_own(c) for c in checks):
        detail = next((c.detail for c in checks if is_own(c)), "not checked")
        raise TestStageFailed(f"torch range: the wheel fails beside its own build torch {own}: {detail}",
                              "nothing was published", tests)
    unchecked = [c for c in checks if c.status == NOT_CHECKED]
    if unchecked:
        passed = torch_names([c for c in checks if c.passed])
        log.warning(f"torch range: --offline: not checked on torch {torch_names(unchecked)} (not on "
                    f"this machine without the network: recorded as not checked, not as failed); the wheel is "
                    f"offered for torch {passed} until `builder verify` checks the others on a machine with the "
                    "network")
    log.ok(f"torch range: {describe_checks(checks)}")
    return checks


def range_env_maker(wheel: Path, index: TorchIndex, base: Path, settings: Settings, *, pure: bool,
                    test_requires: tuple[str, ...], companions: Path | None, here: Sequence[TorchHere],
                    cross_platform: Platform | None = None) -> MakeEnv | None:
    """How torch_range makes the venv beside each torch of ``index``: a cross wheel's is the target platform's
    Python under qemu with that platform's torch; offline, one from this machine's torches (``here``: the build
    env's, cached build venvs') and uv's cache, no download; a pure-Python wheel's has its companions (wheels in
    ``companions``) and the recipe's test requirements, as the import test has them; None (torchrange's default
    venv) for a stable wheel of this machine."""
    if cross_platform is not None:
        return cross.env_maker(cross_platform, wheel, index_args(index), settings)
    extra = test_requires if pure else ()
    if settings.offline:
        return offline_maker(wheel, index, base, here, extra=extra, find_links=companions if pure else None)
    if pure:
        return venv_maker(wheel, index, base, extra=extra, find_links=companions)
    return None


def own_import_check(python: PythonEnv, tests: TestReport) -> TorchCheck:
    """The import test of a pure-Python or per-torch build as its torch check for the build torch (the same imports,
    in a clean venv with that torch)."""
    passed = tests.import_status == "passed"
    return TorchCheck(torch=str(Version(python.torch or "0").public), cuda=python.torch_cuda or "",
                      python=python.version, how=IMPORT_REGISTRATION, status="passed" if passed else "failed",
                      detail="the build's import test" + ("" if passed else f": {tests.import_detail}"))


def test(plan: Plan, kernel: KernelTestPlan, python: PythonEnv, base_python: Path, wheel: Path,
         report: WheelReport, workdir: Path, *, main_wheels: Path | None = None,
         cross_build: cross.CrossBuild | None = None, settings: Settings | None = None) -> TestReport:
    """The import test in a clean venv (a cross build's under qemu), then the kernel tests as ``kernel`` says."""
    if cross_build is not None:  # the import test runs the target's Python under qemu, with the target's torch
        assert settings is not None
        log.info(f"import test under {cross_build.tools.qemu.name}: {cross_build.python.version} for "
                 f"{cross_build.platform}, torch {python.torch} for {cross_build.platform} (slow: one import)")
        test_python = cross_build.test_env(workdir / "test-venv", python.torch or "", wheel, plan.recipe.test_requires,
                                           index_args(plan.index), settings)
        # torch is imported by the import test itself: under qemu each import takes about half a minute
        test_env = replace(probe(test_python, with_torch=False), torch=python.torch, torch_cuda=python.torch_cuda)
        kernel = replace(kernel, skip=f"no {cross_build.platform} GPU available (cross-built on {platform.machine()}; "
                         f"the kernel tests run on an {cross_build.platform} GPU runner)")
    else:
        offline = settings is not None and settings.offline  # a managed venv's torch too: nothing downloaded
        torch_from = None if python.managed and not offline else python
        test_env = fresh_test_env(base_python if python.managed else python.python, python.torch or "", plan.index,
                                  wheel, plan.recipe.test_requires, workdir, torch_from=torch_from,
                                  find_links=main_wheels)  # companions (fla-core for flash-linear-attention) from us
    return run_tests(test_env, plan.recipe, report, workdir, kernel)


@dataclass(frozen=True)
class VariantWheel:
    wheel: Path
    record: BuildRecord
    report: WheelReport


def variants(plan: Plan, kernel: KernelTestPlan, python: PythonEnv, base_python: Path, final: Path,
             record: BuildRecord, workdir: Path, *, settings: Settings, companions: Path,
             cuda_home: Path) -> list[VariantWheel]:
    """One thin wheel per arch of the plain wheel (its fatbins sliced, no second compile), each inspected (only
    its arch's SASS), import-tested and kernel-tested like the plain wheel. Any failure publishes nothing."""
    made: list[VariantWheel] = []
    if (note := one_arch_note(final.name, plan.target.archs)) is not None:
        log.info(note)
        return made
    plain_size = final.stat().st_size
    for arch in sorted({Arch(a.number, a.suffix) for a in plan.target.archs}):
        variant = Variant.for_build(arch, plan.cuda)
        wheel = make_variant(final, variant, workdir / "variants")
        vrecord = variant_record(record, variant)
        report = inspect(BuiltWheel.made(wheel, vrecord), settings, (cuda_home,), show=False)
        tests = test(plan, kernel, python, base_python, wheel, report, workdir / f"variant-{variant.label}",
                     main_wheels=companions, settings=settings)
        shutil.rmtree(workdir / f"variant-{variant.label}" / "test-venv", ignore_errors=True)
        size = wheel.stat().st_size
        log.ok(f"variant {variant.label}: {wheel.name}, {size / 2**20:.1f} MiB ({size / plain_size:.0%} of the plain "
               f"wheel), {arch.sm} only, for drivers of CUDA {variant.cuda_floor}+; import {tests.import_status}, "
               f"kernel {tests.kernel_status}" + (f" ({tests.kernel_reason})" if tests.kernel_reason else ""))
        vrecord = vrecord.with_(tests=tests, inspect=report.as_dict(), wheel=wheel.name)
        made.append(VariantWheel(wheel, vrecord, report))
    return made


def with_gpu_check(record: BuildRecord, env: PythonEnv, tests: TestReport) -> tuple[TorchCheck, ...]:
    """The record's torch checks with this machine's passed kernel suite added for its torch, by the one merge rule
    (model/recordmerge.py ``merge_checks``): it replaces an earlier GPU check of the same torch, CUDA line and GPU
    only; a run on another GPU (another arch: an H200's sm_90 after an RTX 5090's sm_120) adds its check beside the
    first, so the record keeps one per GPU."""
    torch = Version(env.torch or "0")
    counts = ", ".join(f"{v} {k}" for k, v in tests.counts.items())
    check = TorchCheck(torch=str(torch.public), cuda=env.torch_cuda or "", python=env.version or "",
                       how=GPU_KERNEL_TESTS, status="passed", detail=f"{counts} on {tests.gpu or 'a GPU'}".strip())
    return merge_checks(record.torch_checks or (), (check,))
