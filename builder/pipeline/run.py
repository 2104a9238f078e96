"""Chains the stages in one direction: plan → toolchain → source → python (these three resolve the inputs,
pipeline/resolveinputs.py) → patch → build → finalize, then the check chain (pipeline/checks.py: inspect → test → torch
range → publish) on the BuiltWheel finalize made. Nothing reaches the wheelhouse unless every stage before publish
succeeded. This module keeps the order; the checks themselves live in checks.py."""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder import __version__
from builder.core.cachedir import target_lock
from builder.core.errors import UsageError
from builder.core.fsutil import atomic_write
from builder.core.log import log, target_prefix
from builder.core.settings import Settings
from builder.core.wheelfile import source_date_epoch, split_label
from builder.index.store import Wheelhouse
from builder.model.arch import torch_arch_list
from builder.model.builtwheel import BuiltWheel
from builder.model.recipeparts import wheel_build
from builder.model.records import (
    BuildRecord,
    FileDigest,
    PatchDigest,
    RuntimeDropped,
    SourceDigest,
    WheelBuild,
)
from builder.model.variants import UV_PREVIEW_FEATURE
from builder.pipeline import checks
from builder.pipeline.chain import Checked, Step, run_chain
from builder.pipeline.resolveinputs import InputsMemo, ResolvedInputs, check_edges, resolve_inputs, timed
from builder.stages.compile import Parallelism, base_env, build_wheel, parallelism, prefix_map_env
from builder.stages.compileprogress import ExpectedTime
from builder.stages.compilercache import CompilerCache, find_compiler_cache
from builder.stages.finalize import finalize_wheel, portable_record
from builder.stages.inputs import toolkit_record
from builder.stages.patch import apply_patches
from builder.stages.plan import Plan, Target, make_plan
from builder.stages.pyenv import PythonEnv, index_args
from builder.stages.slicing import one_arch_note
from builder.stages.source import unpack
from builder.stages.testing import KernelTestPlan
from builder.stages.torchrange import split_unchecked
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
    variants: bool = False  # also one thin wheel per arch (PEP 825 variants, stages/slicing.py) beside the plain one


def run_build(target: Target, settings: Settings, options: BuildOptions, env: Mapping[str, str] | None = None) -> BuildResult:
    environ = dict(os.environ if env is None else env)
    timings: dict[str, float] = {}
    source_date_epoch(environ)  # empty means unset; nonsense is one line now, not at finalize
    check_edges(target.package, settings, source=target.source)  # a wheelhouse that is a file or read-only, kernel tests a folder: before anything
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
                               ptxas_split=plan.recipe.ptxas_split, peak_gib=plan.recipe.nvcc_peak_gib)
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
    env["SOURCE_DATE_EPOCH"] = str(source_date_epoch(env))  # empty or unset: 1980; nonsense: one line
    ccache = None
    if toolkit is not None and inputs.resolved.compiler is not None:  # ccache wraps host compilers, not an image's
        ccache = find_compiler_cache(options.compiler_cache, settings)
        if ccache is not None:
            env.update(ccache.build_env(toolkit.cuda_home, inputs.workdir / "ccache-stats.log", env))
            log.info(f"compiler cache: {ccache.describe()}")
    if inputs.cross is not None and toolkit is not None:  # after the compiler cache: the target's compilers,
        # headers and libraries
        env.update(inputs.cross.build_env(toolkit.cuda_home, abi3=plan.abi3,
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
    archs = tuple(str(a) for a in plan.target.archs)
    main = Wheelhouse(settings.wheelhouse)  # earlier builds' records (also staged ones): the compile's estimate
    expected = ExpectedTime.of_files([*main.record_files(), *main.staging().record_files()], plan.recipe.name, archs,
                                     inputs.parallel.max_jobs) if toolkit is not None else None
    what = f"{plan.recipe.name} for {', '.join(f'sm_{a}' for a in sorted(archs))}" if toolkit is not None else ""
    with timed(timings, "build"):
        raw = build_wheel(request, host, expected, what)
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
    # the wheel's facts, read once, for every check below; its record (not the one inside the wheel) grows
    built = BuiltWheel.made(final, record.with_(compiler_cache=compiler_cache))
    state = run_chain(Checked(built), _build_steps(inputs, settings, options, house, result), timings=timings)
    if state.published is not None:
        _say_published(house, state, options)


def _build_steps(inputs: BuildInputs, settings: Settings, options: BuildOptions, house: Wheelhouse,
                 result: BuildResult) -> dict[str, Step]:
    """A build's steps of the check chain (pipeline/chain.py), each over this build's context: all of them, the
    variants only with ``--variants`` and a compiler."""
    resolved, workdir = inputs.resolved, inputs.workdir
    plan, python, toolkit = resolved.plan, resolved.python, resolved.host.toolkit
    kernel = kernel_plan(options)
    companions = house.wheels  # the staging area's when staging: the wheels this one is tested beside

    def inspect(state: Checked) -> None:
        state.report = checks.inspect(state.wheel, settings, (toolkit.cuda_home,) if toolkit else ())

    def test(state: Checked) -> None:
        assert state.report is not None
        state.tests = checks.test(plan, kernel, python, resolved.test_python, state.wheel.path, state.report, workdir,
                                  main_wheels=companions, cross_build=inputs.cross, settings=settings)

    def torch_range(state: Checked) -> None:  # every wheel is offered by its torch checks: a stable-ABI wheel's
        assert state.report is not None and state.tests is not None  # range, a per-torch one's CUDA lines, a
        state.torch_checks, state.torch_unchecked = split_unchecked(checks.torch_range(  # pure-Python one's torches
            plan, settings, python, resolved.test_python, state.wheel, workdir, state.tests,
            whole_range=options.torch_range, cross_build=inputs.cross, requires=state.report.requires,
            companions=companions))

    def gpu_check(state: Checked) -> None:  # this machine's GPU ran the kernels: a check for its torch, as
        assert state.tests is not None and state.wheel.record is not None  # `builder test` adds one
        if state.tests.kernel_status == "passed":
            state.torch_checks = checks.with_gpu_check(state.wheel.record.with_(torch_checks=state.torch_checks),
                                                       python, state.tests)

    def variants(state: Checked) -> None:
        assert state.wheel.record is not None and toolkit is not None
        state.variants = checks.variants(plan, kernel, python, resolved.test_python, state.wheel.path,
                                         state.wheel.record, workdir, settings=settings, companions=companions,
                                         cuda_home=toolkit.cuda_home)

    def publish(state: Checked) -> None:
        assert state.report is not None
        record = _final_record(state, inputs, result)
        if plan.target.subset is not None:  # tests only: never published
            _keep_subset(plan.target.subset, state.wheel.path, record, result)
            return
        state.published = checks.publish(house, state.wheel.with_record(record), state.report,
                                         replace_other=options.replace)
        for variant in state.variants:  # after the plain wheel: a tool that knows no variants always finds that one
            vrecord = variant.record.with_(torch_checks=state.torch_checks,
                                           torch_unchecked=state.torch_unchecked or None)
            checks.publish(house, BuiltWheel.made(variant.wheel, vrecord), variant.report,
                           replace_other=options.replace)
        result.wheel, result.record, result.status = state.published, record, "built"

    steps: dict[str, Step] = {"inspect": inspect, "test": test, "torch range": torch_range, "gpu check": gpu_check,
                              "publish": publish}
    if options.variants and toolkit is not None:
        steps["variants"] = variants
    return steps


def _final_record(state: Checked, inputs: BuildInputs, result: BuildResult) -> BuildRecord:
    """The record the wheelhouse keeps: the wheel's own grown by what the chain found (after finalize: not inside the
    wheel, which stays reproducible)."""
    assert state.wheel.record is not None and state.report is not None
    plan = inputs.resolved.plan
    return state.wheel.record.with_(
        timings=dict(result.timings), tests=state.tests, inspect=state.report.as_dict(), wheel=state.wheel.path.name,
        parallel=inputs.parallel.record() if inputs.resolved.host.toolkit else None, torch_checks=state.torch_checks,
        torch_unchecked=state.torch_unchecked or None, abi_choice=plan.abi_why or None)


def _say_published(house: Wheelhouse, state: Checked, options: BuildOptions) -> None:
    """Where the build's wheel went and the index or channels a user points uv or pip at."""
    assert state.published is not None
    published = state.published
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
    if state.variants:
        log.ok(f"variants: {', '.join(v.wheel.name for v in state.variants)} beside it (uv --preview-features "
               f"{UV_PREVIEW_FEATURE} picks the one for the GPU; pip the plain wheel)")


def _keep_subset(subset: str, final: Path, record: BuildRecord, result: BuildResult) -> None:
    """A ``--subset`` build's end: the wheel stays where finalize put it, its record beside it (``builder test``
    and the kernel-test scripts read both), and nothing is published (index/store.py refuses it anyway)."""
    atomic_write(final.with_name(final.name + ".json"), json.dumps(record.to_json(), indent=1) + "\n")
    result.wheel, result.record, result.status = final, record, "built"
    log.ok(f"subset {subset}: built and tested, not published (a [[subset]] build is for tests only): {final} "
           "(record beside it)")


def kernel_plan(options: BuildOptions) -> KernelTestPlan:
    """The kernel tests a build runs: none when staged (they run at promotion) or with --no-kernel-tests."""
    skip = "staged: kernel tests run at promotion" if options.stage else (
        None if options.kernel_tests else "--no-kernel-tests")
    return KernelTestPlan(skip=skip, quick=options.quick_kernel_tests,
                          required=options.require_kernel_tests and not options.stage)


def label_and_pins(plan: Plan, torch: str) -> tuple[str | None, list[str]]:
    """What finalize writes: the local label (a stable-ABI wheel's ``cu13`` names no channel, a pure-Python wheel
    has none: their checks say where they are offered) and the pins: the torch requirement (none for a pure-Python
    wheel, which keeps upstream's) and the recipe's runtime requirements."""
    label = plan.label(torch) if torch else None
    requirement = plan.torch_requirement(torch) if torch else None
    return label, [*([requirement] if requirement else []), *plan.recipe.runtime_requires]


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
        build=_wheel_build(plan),
        subset=plan.target.subset,
    )


def _wheel_build(plan: Plan) -> WheelBuild | None:
    """The wheel's build number from the recipe's fix patches (docs/INDEX.md "Superseded builds"); None: build 0."""
    number, by = wheel_build(plan.patches)
    return WheelBuild(number, tuple(f"{p.name}: {p.summary}" for p in by)) if number else None


