"""Chains the stages in one direction: plan → toolchain → source → python (these three resolve the inputs,
pipeline/inputs.py) → patch → build → finalize → inspect → test → publish. Nothing reaches the wheelhouse
unless every stage before publish succeeded."""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from builder import __version__
from builder.core.cachedir import target_lock
from builder.core.errors import InspectError, UsageError
from builder.core.log import log, target_prefix
from builder.core.settings import Settings
from builder.core.wheelfile import split_label
from builder.index.store import Wheelhouse
from builder.model.arch import Arch, torch_arch_list
from builder.model.records import (
    BuildRecord,
    FileDigest,
    PatchDigest,
    RuntimeDropped,
    SourceDigest,
    TestReport,
    TorchCheck,
)
from builder.model.variants import UV_PREVIEW_FEATURE, Variant
from builder.pipeline.inputs import InputsMemo, ResolvedInputs, resolve_inputs, timed
from builder.stages.compile import Parallelism, base_env, build_wheel, parallelism, prefix_map_env
from builder.stages.compilercache import CompilerCache, find_compiler_cache
from builder.stages.finalize import finalize_wheel, portable_record
from builder.stages.inputs import toolkit_record
from builder.stages.inspection import (
    WheelReport,
    inspect_wheel,
    render_report,
    verify_archs,
    verify_platform,
)
from builder.stages.patch import apply_patches
from builder.stages.plan import Plan, Target, make_plan
from builder.stages.pyenv import PythonEnv, fresh_test_env, index_args, probe
from builder.stages.source import unpack
from builder.stages.testing import KernelTestPlan, TestStageFailed, run_tests
from builder.stages.torchrange import (
    IMPORT_REGISTRATION,
    NOT_CHECKED,
    Claim,
    PurePython,
    TorchHere,
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
from builder.stages.variants import make_variant, one_arch_note, variant_record
from builder.toolchain import CudaToolkit, cross
from builder.toolchain.base import WheelRequest
from builder.toolchain.cibw import EXCLUDED_LIBS


@dataclass
class BuildResult:
    plan: Plan
    wheel: Path | None = None
    status: str = "pending"  # built | unchanged | failed
    timings: dict[str, float] = field(default_factory=dict)
    record: BuildRecord | None = None


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    force: bool = False
    kernel_tests: bool = True
    require_kernel_tests: bool = False
    quick_kernel_tests: bool = False
    keep_workdir: bool = False
    stage: bool = False  # publish into wheelhouse/staging; `builder test` on a GPU machine promotes it
    compiler_cache: str = "auto"  # auto | ccache | off (see compilercache.py); never part of the cache key
    replace: bool = False  # replace a published wheel of the same file name built for another arch set
    torch_range: bool = True  # a stable-ABI wheel: try every torch of its range (False: the build torch only)
    variants: bool = False  # also one thin wheel per arch (PEP 825 variants, stages/variants.py) beside the plain one


def run_build(target: Target, settings: Settings, options: BuildOptions, env: Mapping[str, str] | None = None) -> BuildResult:
    environ = dict(os.environ if env is None else env)
    timings: dict[str, float] = {}
    with timed(timings, "plan"):
        plan = make_plan(target, settings)
    result = BuildResult(plan, timings=timings)
    check_variants_option(plan, options)
    with target_prefix(f"{plan.recipe.name}-{plan.version}"):
        log.step("plan")
        for key, value in plan.describe():
            log.info(f"  {key:13} {value}")
        _build_planned(plan, settings, options, environ, result)
    return result


def _build_planned(plan: Plan, settings: Settings, options: BuildOptions, environ: dict[str, str],
                   result: BuildResult) -> None:
    if plan.recipe.kind.is_cuda and cross.is_cross(plan.target.platform):
        # the cross compilers first (a missing one fails in a second); as CC/CXX they enter the cache key
        tools = cross.find_tools(plan.target.platform, environ)
        environ = {**environ, "CC": str(tools.cc), "CXX": str(tools.cxx)}
    with InputsMemo() as memo:  # closes the toolchain's host (a container) after the build
        resolved = resolve_inputs(plan, settings, environ, memo, timings=result.timings)
        _build_with(resolved, settings, options, environ, result)


@dataclass(frozen=True)
class BuildInputs:
    """What the build of one target works from once its cache key is known."""

    resolved: ResolvedInputs  # the host, source, Python, host compiler and the cache key
    workdir: Path
    parallel: Parallelism  # MAX_JOBS, nvcc and ptxas threads
    cross: cross.CrossBuild | None = None  # a wheel for another CPU platform: its target Python and torch


def _build_with(resolved: ResolvedInputs, settings: Settings, options: BuildOptions, environ: dict[str, str],
                result: BuildResult) -> None:
    plan, key = resolved.plan, resolved.key
    main_house = Wheelhouse(settings.wheelhouse)
    house = main_house.staging() if options.stage else main_house
    with target_lock(settings, key):
        existing = main_house.find_record(key) or (house.find_record(key) if options.stage else None)
        if existing and not options.force:
            result.wheel, result.record, result.status = existing[0], existing[1], "unchanged"
            log.ok(f"unchanged: {existing[0].name} was built from the same inputs (cache key {key[:12]}); "
                   "nothing to do (--force rebuilds)")
            if options.variants and (note := one_arch_note(existing[0].name, plan.target.archs)) is not None:
                log.info(note)
            elif options.variants and not _has_variants(existing[0]):
                log.warning(f"--variants: {existing[0].name} was published without its variants; "
                            "`--force` builds it again with them")
            return
        workdir = settings.cache("builds") / f"{plan.recipe.name}-{plan.version}-{key[:12]}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        parallel = parallelism(plan.target.jobs, plan.target.archs, resolved.toolkit,
                               ptxas_split=plan.recipe.ptxas_split)
        inputs = BuildInputs(resolved, workdir, parallel, _cross_build(resolved, settings, environ))
        try:
            _build_in(inputs, settings, options, environ, house, result)
        finally:
            if not options.keep_workdir and result.status == "built":
                # what a published build no longer needs: the sources, the raw wheel, the import-test venv
                # (hard links into uv's cache, but a full copy where the cache lives on another disk)
                for name in ("src", "dist", "test-venv"):
                    shutil.rmtree(workdir / name, ignore_errors=True)


def _has_variants(wheel: Path) -> bool:
    return any(split_label(p.name)[1] is not None and split_label(p.name)[0] == wheel.name
               for p in wheel.parent.glob(wheel.name[:-4] + "-*.whl"))


def check_variants_option(plan: Plan, options: BuildOptions) -> None:
    """--variants needs GPU code to slice, and a test environment that installs variants (not yet under qemu)."""
    if not options.variants:
        return
    if not plan.recipe.kind.is_cuda:
        raise UsageError(f"--variants: {plan.recipe.name} is pure Python; it has no GPU code to make variants of",
                         "leave --variants out for it")
    if cross.is_cross(plan.target.platform):
        raise UsageError(f"--variants with --platform {plan.target.platform}: a cross build's import test under qemu "
                         "does not install variant wheels yet", "build the plain wheel (leave --variants out)")


def _cross_build(resolved: ResolvedInputs, settings: Settings, environ: Mapping[str, str]) -> cross.CrossBuild | None:
    plan = resolved.plan
    if not (plan.recipe.kind.is_cuda and cross.is_cross(plan.target.platform)):
        return None
    cross.check_toolkit(plan.target.platform, resolved.host.toolkit)
    log.step("cross")
    build = cross.prepare(plan.target.platform, resolved.python.torch or "", index_args(plan.index), settings, environ)
    log.info(build.describe())
    return build


def _compile_env(inputs: BuildInputs, settings: Settings, options: BuildOptions, environ: Mapping[str, str],
                 root: Path) -> tuple[dict[str, str], CompilerCache | None]:
    """The build's environment: the host's base (in a container none of this machine's variables), the recipe's
    env, the toolkit, the arch list, MAX_JOBS, the compiler cache (builds with a host compiler) and prefix maps."""
    plan, host, toolkit = inputs.resolved.plan, inputs.resolved.host, inputs.resolved.toolkit
    env = base_env(host.base_env(environ))
    env.update(plan.env)
    if toolkit is not None:
        env.update(toolkit.build_env(env.get("PATH", "/usr/bin:/bin")))
        env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(plan.target.archs)
        flags = [*toolkit.nvcc_flags_for(ptxas_split=plan.recipe.ptxas_split), *inputs.parallel.nvcc_flags()]
        if flags:  # before the recipe's own NVCC_APPEND_FLAGS: nvcc takes an option's last value
            env["NVCC_APPEND_FLAGS"] = " ".join([*flags, env.get("NVCC_APPEND_FLAGS", "")]).strip()
    env["MAX_JOBS"] = str(plan.target.jobs)
    env.setdefault("SOURCE_DATE_EPOCH", "315532800")
    ccache = None
    if toolkit is not None and inputs.resolved.compiler is not None:  # ccache wraps host compilers, not an image's
        ccache = find_compiler_cache(options.compiler_cache, settings)
        if ccache is not None:
            env.update(ccache.build_env(toolkit.cuda_home, inputs.workdir / "ccache-stats.log", env))
            log.info(f"compiler cache: {ccache.describe()}")
    if inputs.cross is not None and toolkit is not None:  # after the compiler cache: the target's compilers,
        # headers and libraries
        env.update(inputs.cross.build_env(toolkit.cuda_home, abi3=plan.stable,
                                          python_version=inputs.resolved.python.version))
    if toolkit is not None:  # after the compiler cache: the maps differ per build folder, their output does not
        env.update(prefix_map_env(env, [(host.path(root), f"/build/{root.name}"),
                                        (host.path(inputs.resolved.python.purelib), "/site-packages"),
                                        (toolkit.cuda_home, "/cuda")]))
    return env, ccache


def _build_in(inputs: BuildInputs, settings: Settings, options: BuildOptions, environ: dict[str, str],
              house: Wheelhouse, result: BuildResult) -> None:
    resolved, workdir = inputs.resolved, inputs.workdir
    plan, host, python, key = resolved.plan, resolved.host, resolved.python, resolved.key
    toolkit, timings = host.toolkit, result.timings
    torch = python.torch or ""
    log.step("patch")
    with timed(timings, "patch"):
        root = unpack(resolved.source, workdir / "src")
        apply_patches(root, plan.patches, plan.recipe.name, plan.version)
    log.step("build")
    if toolkit is not None:
        log.info(f"parallel: {inputs.parallel.describe()}")
    env, ccache = _compile_env(inputs, settings, options, environ, root)
    log_file = settings.cache("logs") / f"{plan.recipe.name}-{plan.version}-{key[:12]}.log"
    request = WheelRequest(source_dir=root, python=python.python, env=env, out_dir=workdir / "dist",
                           log_file=log_file, prepared=python.prepared)
    with timed(timings, "build"):
        raw = build_wheel(request, host)
        if inputs.cross is not None:  # what the container toolchain's cibuildwheel does: the manylinux tag
            raw = cross.repair(raw, workdir / "repaired", inputs.cross.platform, EXCLUDED_LIBS)
    compiler_cache = ccache.stats(workdir / "ccache-stats.log") if ccache is not None else None
    if compiler_cache is not None:
        log.info("compiler cache: " + ", ".join(f"{v} {k}" for k, v in compiler_cache.items()))
    log.step("finalize")
    label, pins = label_and_pins(plan, torch)
    record = build_record(plan, key=key, source_digest=resolved.source_digest, toolkit=toolkit,
                          compiler=resolved.compiler, python=python, log_file=log_file)
    with timed(timings, "finalize"):
        final = finalize_wheel(raw, workdir / "final", label=label, pins=pins,
                               build_record=portable_record(record, settings.cache_dir), drop=plan.recipe.runtime_drop,
                               requires_python=plan.requires_python)
    log.info(f"wheel: {final.name}")
    log.step("inspect")
    with timed(timings, "inspect"):
        report = inspect_wheel(final, settings, (toolkit.cuda_home,) if toolkit else ())
    log.info(render_report(report))
    if toolkit is not None:
        problems = verify_archs(report, plan.target.archs) + verify_platform(report, plan.target.platform)
        if problems:
            raise InspectError("GPU code check failed: " + "; ".join(problems), "nothing was published")
        log.ok(f"GPU code check passed: {', '.join(sorted(report.sass | report.ptx))}")
    if plan.stable:
        stable_problems = report.stable_abi.problems() if report.stable_abi else ["no stable-ABI report"]
        if stable_problems:
            raise InspectError("stable-ABI check failed: " + "; ".join(stable_problems),
                               "nothing was published; the port still calls torch's C++ API somewhere")
        assert report.stable_abi is not None
        log.ok(f"stable-ABI check passed: no torch C++ imports, {len(report.stable_abi.shim_imports)} C shims, "
               f"abi3 tag, abi3audit {report.stable_abi.abi3audit}")
    log.step("test")
    with timed(timings, "test"):
        companions = house.wheels  # the staging area's when staging: the wheels this one is tested beside
        tests = test_stage(plan, options, python, resolved.test_python, final, report, workdir, main_wheels=companions,
                           cross_build=inputs.cross, settings=settings)
    torch_checks: tuple[TorchCheck, ...] | None = None
    torch_unchecked: tuple[TorchCheck, ...] = ()
    if plan.ranged:
        log.step("torch range")
        with timed(timings, "torch range"):
            torch_checks, torch_unchecked = split_unchecked(torch_range_stage(
                plan, settings, python, resolved.test_python, final, workdir, tests, whole_range=options.torch_range,
                cross_build=inputs.cross, requires=report.requires, companions=companions))
    made: list[VariantWheel] = []
    if options.variants and toolkit is not None:
        log.step("variants")
        with timed(timings, "variants"):
            made = variants_stage(plan, options, python, resolved.test_python, final, record, workdir,
                                  settings=settings, companions=companions, cuda_home=toolkit.cuda_home)
    log.step("publish")
    # after finalize: not inside the wheel, which stays reproducible
    record = record.with_(timings=dict(timings), tests=tests, inspect=report.as_dict(), wheel=final.name,
                          compiler_cache=compiler_cache, parallel=inputs.parallel.record() if toolkit else None,
                          torch_checks=torch_checks, torch_unchecked=torch_unchecked or None,
                          abi_choice=plan.abi_why or None)
    with timed(timings, "publish"):
        published = house.publish(final, record, replace=options.replace, portability=report.portability)
        for variant in made:  # after the plain wheel: a tool that knows no variants always finds that one
            house.publish(variant.wheel, variant.record.with_(torch_checks=torch_checks,
                                                              torch_unchecked=torch_unchecked or None),
                          replace=options.replace,
                          portability=variant.report.portability)
    result.wheel, result.record, result.status = published, record, "built"
    where = "staged (run `builder test` on a GPU machine to promote it)" if options.stage else "published"
    # the channel, never the combined simple/: a resolver given that one may swap the env's torch (README)
    channels = house.channels_of(published.name)
    if len(channels) > 1:  # a stable-ABI wheel: the channel of each torch it was verified on
        index = f"channels {', '.join(channels)}: {house.channel_url_template()}"
    elif channels:
        index = f"channel: {house.channel_url(channels[0])}"
    else:
        index = f"index: {house.index_url()}"
    log.ok(f"{where}: {published} ({index})")
    if made:
        log.ok(f"variants: {', '.join(v.wheel.name for v in made)} beside it (uv --preview-features "
               f"{UV_PREVIEW_FEATURE} picks the one for the GPU; pip the plain wheel)")


def label_and_pins(plan: Plan, torch: str) -> tuple[str | None, list[str]]:
    """What finalize writes: the local label (a stable-ABI wheel's ``cu13`` names no channel, a pure-Python wheel
    has none: their checks say where they are offered) and the pins: the torch requirement (none for a pure-Python
    wheel, which keeps upstream's) and the recipe's runtime requirements."""
    label = plan.label(torch) if torch else None
    requirement = plan.torch_requirement(torch) if torch else None
    return label, [*([requirement] if requirement else []), *plan.recipe.runtime_requires]


@dataclass(frozen=True)
class VariantWheel:
    wheel: Path
    record: BuildRecord
    report: WheelReport


def variants_stage(plan: Plan, options: BuildOptions, python: PythonEnv, base_python: Path, final: Path,
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
        report = inspect_wheel(wheel, settings, (cuda_home,))
        problems = verify_archs(report, (arch,)) + verify_platform(report, plan.target.platform)
        if problems:
            raise InspectError(f"variant {variant.label}: GPU code check failed: " + "; ".join(problems),
                               "nothing was published")
        tests = test_stage(plan, options, python, base_python, wheel, report, workdir / f"variant-{variant.label}",
                           main_wheels=companions, settings=settings)
        shutil.rmtree(workdir / f"variant-{variant.label}" / "test-venv", ignore_errors=True)
        size = wheel.stat().st_size
        log.ok(f"variant {variant.label}: {wheel.name}, {size / 2**20:.1f} MiB ({size / plain_size:.0%} of the plain "
               f"wheel), {arch.sm} only, for drivers of CUDA {variant.cuda_floor}+; import {tests.import_status}, "
               f"kernel {tests.kernel_status}" + (f" ({tests.kernel_reason})" if tests.kernel_reason else ""))
        vrecord = variant_record(record, variant).with_(tests=tests, inspect=report.as_dict(), wheel=wheel.name)
        made.append(VariantWheel(wheel, vrecord, report))
    return made


def build_record(plan: Plan, *, key: str, source_digest: str, toolkit: CudaToolkit | None,
                 compiler: dict[str, str] | None, python: PythonEnv, log_file: Path) -> BuildRecord:
    """The build record as finalize writes it into the wheel (model/records.py serialises it)."""
    drop = plan.recipe.runtime_drop  # absent otherwise, so records (and wheels) of other recipes stay as they were
    return BuildRecord(
        builder_version=__version__, cache_key=key, package=plan.recipe.name, version=plan.version,
        recipe=FileDigest(file=plan.recipe.file.name, sha256=plan.recipe.sha256(),
                          content_sha256=plan.recipe.content_digest()),
        source=SourceDigest(kind=plan.source.kind, location=plan.source.location, sha256=source_digest),
        patches=tuple(PatchDigest(file=p.name, sha256=p.sha256(), versions=str(p.versions)) for p in plan.patches),
        cuda=str(plan.cuda), archs=tuple(str(a) for a in plan.target.archs) if toolkit else (),
        toolchain=toolkit_record(plan, toolkit) or {"kind": "none (pure Python)"}, host_compiler=compiler,
        python=python.record(), torch_index=plan.index.url,
        host={"machine": platform.machine(), "system": platform.platform()}, build_log=str(log_file),
        runtime_dropped=RuntimeDropped(names=tuple(drop), reason=plan.recipe.runtime_drop_reason) if drop else None,
        abi=str(plan.abi) if plan.stable else None,
        torch_floor=plan.recipe.stable_abi.floor_text if plan.stable and plan.recipe.stable_abi else None,
        platform=plan.recorded_platform,
    )


def torch_range_stage(plan: Plan, settings: Settings, python: PythonEnv, base_python: Path, wheel: Path,
                      workdir: Path, tests: TestReport, *, whole_range: bool = True,
                      cross_build: cross.CrossBuild | None = None, requires: tuple[str, ...] = (),
                      companions: Path | None = None) -> tuple[TorchCheck, ...]:
    """A wheel offered across torches beside every torch minor it claims (stages/torchrange.py): a stable-ABI
    wheel's port range, a pure-Python wheel's own torch requirement (``requires``: its Requires-Dist lines) on
    every CUDA line from 12.8 on. The build's own torch must pass (for a stable wheel it is tried again in a
    fresh venv; for a pure-Python one the import test is that check); a failure on another torch only keeps the
    wheel out of that torch's channel, and says so."""
    claim: Claim
    if plan.pure_python:
        claim = PurePython.of_requires(requires)
    else:
        assert plan.recipe.stable_abi is not None
        claim = plan.recipe.stable_abi
    own = Version(python.torch or "0").public
    built = own_import_check(python, tests) if plan.pure_python else None
    torches = torches_to_check(plan.index, plan.cuda, claim)
    offline = settings.offline and cross_build is None
    if offline and python.torch and not any(Version(t).public == own for t, _ in torches):
        torches.append((str(own), ".".join((python.torch_cuda or str(plan.cuda)).split(".")[:2])))  # not listed
    if not whole_range or (settings.offline and not offline):
        why = "--no-torch-range" if not whole_range else "--offline (a cross build)"
        log.warning(f"torch range: {why}, so only the build's torch is checked and the wheel is offered for it "
                    "alone until `builder verify` checks the others")
        torches = [(t, line) for t, line in torches if Version(t).public == own]
    if built is not None:  # the import test tried this one already
        torches = [(t, line) for t, line in torches if (Version(t).public, line) != (own, built.cuda)]
    rounds = [(plan.index, torches)]
    if whole_range and not settings.offline:  # the torches of the other indexes the wheel claims (cu130's 2.15)
        have = [*torches, *([(built.torch, built.cuda)] if built else [])]
        rounds += read_here(other_index_torches(plan.index, plan.cuda, claim, have, settings))
    elif whole_range and offline:  # tried from this machine's caches; what they lack is NOT_CHECKED, not failed
        have = [*torches, *([(built.torch, built.cuda)] if built else [])]
        rounds += other_index_torches(plan.index, plan.cuda, claim, have, settings)
    checks: tuple[TorchCheck, ...] = (built,) if built else ()
    extra = plan.recipe.test_requires if plan.pure_python else ()
    base = base_python if python.managed else python.python
    here = [h for h in (TorchHere.of(python, "the build env"),) if h is not None]
    if offline:
        here += [h for h in cached_torches(settings.cache("venvs"), python.version)
                 if Version(h.torch).public != own]
    for index, these in rounds:
        make_env = None  # a cross build's: the target platform's Python under qemu, with that platform's torch
        if cross_build is not None:
            make_env = cross.env_maker(cross_build.platform, wheel, index_args(index), settings)
        elif offline:  # the build env's torch, cached venvs' and uv's cache: no download
            make_env = offline_maker(wheel, index, base, here, extra=extra,
                                     find_links=companions if plan.pure_python else None)
        elif plan.pure_python:  # its companions and test requirements, as the import test has them
            make_env = venv_maker(wheel, index, base, extra=extra, find_links=companions)
        if these:
            checks += check_torch_range(wheel, claim, plan.recipe.imports, these, index, base, workdir,
                                        make_env=make_env)
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


def own_import_check(python: PythonEnv, tests: TestReport) -> TorchCheck:
    """The import test of a pure-Python build as its torch check for the build torch (the same imports, in a
    clean venv with that torch)."""
    passed = tests.import_status == "passed"
    return TorchCheck(torch=str(Version(python.torch or "0").public), cuda=python.torch_cuda or "",
                      python=python.version, how=IMPORT_REGISTRATION, status="passed" if passed else "failed",
                      detail="the build's import test" + ("" if passed else f": {tests.import_detail}"))


def test_stage(plan: Plan, options: BuildOptions, python: PythonEnv, base_python: Path, wheel: Path,
               report: WheelReport, workdir: Path, *, main_wheels: Path | None = None,
               cross_build: cross.CrossBuild | None = None, settings: Settings | None = None) -> TestReport:
    skip = None
    if cross_build is not None:  # the import test runs the target's Python under qemu, with the target's torch
        assert settings is not None
        log.info(f"import test under {cross_build.tools.qemu.name}: {cross_build.python.version} for "
                 f"{cross_build.platform}, torch {python.torch} for {cross_build.platform} (slow: one import)")
        test_python = cross_build.test_env(workdir / "test-venv", python.torch or "", wheel, plan.recipe.test_requires,
                                           index_args(plan.index), settings)
        # torch is imported by the import test itself: under qemu each import takes about half a minute
        test_env = replace(probe(test_python, with_torch=False), torch=python.torch, torch_cuda=python.torch_cuda)
        skip = (f"no {cross_build.platform} GPU available (cross-built on {platform.machine()}; the kernel tests "
                f"run on an {cross_build.platform} GPU runner)")
    else:
        offline = settings is not None and settings.offline  # a managed venv's torch too: nothing downloaded
        torch_from = None if python.managed and not offline else python
        test_env = fresh_test_env(base_python if python.managed else python.python, python.torch or "", plan.index,
                                  wheel, plan.recipe.test_requires, workdir, torch_from=torch_from,
                                  find_links=main_wheels)  # companions (fla-core for flash-linear-attention) from us
    if skip is None and options.stage:
        skip = "staged: kernel tests run at promotion"
    elif skip is None and not options.kernel_tests:
        skip = "--no-kernel-tests"
    kernel = KernelTestPlan(skip=skip, quick=options.quick_kernel_tests,
                            required=options.require_kernel_tests and not options.stage)
    return run_tests(test_env, plan.recipe, report, workdir, kernel)
