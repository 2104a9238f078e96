"""The commands on one target or wheel: build, test, plan, recipes, inspect, verify, variants.

The pipeline's modules (pipeline/run, promote, verify, variants; index/store, stages/inspection) and
user/targetenv are imported in the handlers, not at the top: together they add about 50 modules and 130-200 ms to
every `builder` start (``python -X importtime -c 'import builder.cli.main'``), which `builder --help` and an
unchanged farm's no-op need not pay (issue 19).

Over 400 lines on purpose: the seven commands share one flag set (``_target_args``) and one translation of flags into
a ``Target`` (``_target``, ``_platform``, ``_check_cheap_flags``, ``source_location``); each handler is a few lines
over the pipeline, so a module per command would scatter that one translation."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version
from rich.markup import escape
from rich.table import Table

from builder.cli import numbers
from builder.cli.common import out, settings_from_args
from builder.core.cachedir import memo_dir
from builder.core.errors import BuilderError, UsageError
from builder.core.settings import Settings, default_jobs
from builder.discovery.compat import known_cuda_text, resolve_index
from builder.model.abi import ABI_CHOICES
from builder.model.platform import Platform, parse_platform, this_machine
from builder.model.python import PythonSpec
from builder.model.recipe import RecipeKind, expand_name, find_recipe, list_recipes, load_recipe
from builder.stages.compilercache import add_compiler_cache_arg
from builder.stages.plan import Plan, Target, load_target_recipe, make_plan, validate_cuda
from builder.toolchain import TOOLCHAINS
from builder.toolchain.select import probe_build_here

if TYPE_CHECKING:
    from builder.pipeline.run import BuildOptions, BuildResult


def _target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", help="recipe name, e.g. causal-conv1d")
    parser.add_argument("--version", help="upstream version (default: newest the recipe supports)")
    parser.add_argument("--cuda", metavar="X.Y",
                        help=f"CUDA version: one of {known_cuda_text()}; default with --python PATH: that env's "
                        "torch's CUDA. 12.x needs Docker or a host CUDA install (PyPI has no CUDA 12 compiler); 12.9 "
                        "needs --torch-index cu129; `builder torch-table` shows the torch builds per CUDA")
    parser.add_argument("--arch", help="GPU archs: 120, 90,120, 120+ptx (+ptx also embeds PTX) or native (this "
                        "machine's GPUs; the default when a GPU is present); required for CUDA extensions "
                        "(causal-conv1d), not needed for pure-Python recipes (fla)")
    parser.add_argument("--python", type=PythonSpec, default="3.12",
                        help="Python version (3.12) or path to an interpreter with torch")
    parser.add_argument("--torch", help="torch version to build against (default: newest for --cuda on the index)")
    parser.add_argument("--torch-index", help="index for torch: pypi (default), cu128, or a URL")
    parser.add_argument("--toolchain", choices=TOOLCHAINS, default="auto", help="where nvcc comes from")
    parser.add_argument("--abi", choices=ABI_CHOICES, default="auto",
                        help="torch-stable: one cp310-abi3 wheel for every torch of the CUDA major from the recipe's "
                        "floor on (recipes with a stable-ABI port); per-torch: pinned to one torch; auto (default): "
                        "torch-stable where the recipe's port covers the version and torch")
    parser.add_argument("--platform", help="CPU platform of the wheel: x86_64 or aarch64 (GH200, GB200/GB300, "
                        "Jetson Thor, DGX Spark); default: this machine's, or with --python PATH that env's. Another "
                        "than this machine's is cross-compiled (docs/BUILDS.md \"aarch64\")")
    parser.add_argument("--source", type=source_location,
                        help="override sources: a local path, an archive URL, or git+URL[@ref]")
    parser.add_argument("--jobs", type=numbers.jobs, help="MAX_JOBS for the compile (default: sized to cores and memory)")
    parser.add_argument("--subset", metavar="NAME", help="a smaller build the recipe defines for tests and CI "
                        "([[subset]], e.g. flash-attn's hdim128): built and tested, never published")
    # test-only (fault planting for the kernel-test checks): works, but hidden from users' --help
    parser.add_argument("--test-patch", action="append", default=[], help=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    """The seven commands' parsers, in `builder --help`'s order; their handlers by name (``COMMANDS``)."""
    _register_build(sub, add_common)
    _register_test(sub, add_common)
    _register_variants_verify(sub, add_common)
    _register_plan_recipes(sub, add_common)
    p = sub.add_parser("inspect", help="list the GPU code, tags and pins of a wheel")
    p.add_argument("wheel", type=Path, help="a wheel file")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    add_common(p, "cache-dir", "offline")
    return COMMANDS


def _register_build(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("build", help="build, verify, test and publish one wheel")
    _target_args(p)
    add_compiler_cache_arg(p)
    add_common(p)
    p.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    p.add_argument("--no-kernel-tests", action="store_true", help="run only the import test")
    p.add_argument("--require-kernel-tests", action="store_true", help="treat skipped kernel tests as failure")
    p.add_argument("--quick", action="store_true", help="a quick subset of kernel tests")
    p.add_argument("--keep-workdir", action="store_true", help="keep the extracted, patched sources, the raw wheel and the test venv "
                   "(a failed build always keeps them)")
    p.add_argument("--stage", action="store_true",
                   help="publish into wheelhouse/staging (no GPU here); `builder test` on a GPU machine promotes it")
    p.add_argument("--replace", action="store_true",
                   help="replace a published wheel of the same file name even when it was built for other archs")
    p.add_argument("--no-torch-range", action="store_true",
                   help="a stable-ABI wheel: check it beside its build torch only (no download of the other torches "
                   "of its range); `builder verify` checks them later")
    p.add_argument("--variants", action="store_true",
                   help="also publish one thin wheel per arch (PEP 825 wheel variants, sliced from the same compile), "
                   "each tested; uv --preview-features wheel-variants picks the one for the GPU, pip the plain wheel")


def _register_test(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("test", help="import- and kernel-test a wheel here; promote it from staging if it passes")
    p.add_argument("wheel", help="a wheel file, or a package name (its wheels in staging, else published)")
    p.add_argument("--python", help="interpreter whose torch to use (offline GPU machines); default: fresh venv")
    p.add_argument("--require-kernel-tests", action="store_true", help="treat skipped kernel tests as failure")
    p.add_argument("--quick", action="store_true", help="a quick subset of kernel tests")
    p.add_argument("--no-bench", action="store_true", help="skip the speed measurement")
    p.add_argument("--no-promote", action="store_true", help="test a staged wheel without promoting it")
    p.add_argument("--sanitize", nargs="?", const="memcheck", choices=("memcheck", "racecheck"), metavar="TOOL",
                   help="run the quick kernel tests (boundary shapes) under compute-sanitizer TOOL (memcheck, the "
                   "default, or racecheck); an error it finds fails the test. Needs a GPU host that supports the "
                   "tool (bare metal or Firecracker; not gVisor)")
    p.add_argument("--with", dest="with_wheels", action="append", type=Path, default=[], metavar="WHEEL",
                   help="another wheel to install beside it (e.g. causal-conv1d for fla's fast-path check)")
    add_common(p)


def _register_variants_verify(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("variants", help="stage one thin wheel per arch (PEP 825 variants) of wheels already built, "
                       "without compiling; `builder test` on a GPU promotes them")
    p.add_argument("wheel", help="a wheel file, or a package name (its wheels in staging, else published)")
    p.add_argument("--arch", help="only these archs (default: every arch the wheel was built for)")
    add_common(p)

    p = sub.add_parser("verify", help="try published stable-ABI and pure-Python wheels on torches they "
                       "have no check for (released since they were built)")
    p.add_argument("package", nargs="*", help="recipe names (default: every package with a stable-ABI or pure-Python wheel)")
    p.add_argument("--python", default="3.12", help="Python version of the check venvs (default 3.12)")
    p.add_argument("--pre", action="store_true", help="also try torch pre-releases the wheel's torch index lists "
                   "(2.16.0rc1; PyPI carries none: PyTorch puts its release candidates on download.pytorch.org/whl/test)")
    add_common(p)


def _register_plan_recipes(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("plan", help="show what a build would do, without building")
    _target_args(p)
    add_common(p)

    p = sub.add_parser("recipes", help="list recipes, or show one resolved for a target")
    add_common(p)
    rsub = p.add_subparsers(dest="recipes_command")
    show = rsub.add_parser("show", help="show one recipe, resolved for a target")
    show.add_argument("name", help="recipe name, e.g. causal-conv1d")
    show.add_argument("--version", help="upstream version to resolve it for (default: newest the recipe supports)")
    show.add_argument("--cuda", default="13.0", help="CUDA to resolve it for (default 13.0)")
    show.add_argument("--arch", default="120", help="GPU archs to resolve it for (default 120)")
    show.add_argument("--python", type=PythonSpec, default="3.12", help="Python version or interpreter (default 3.12)")
    show.add_argument("--torch", help="torch version (default: the plan's choice for the CUDA)")
    show.add_argument("--torch-index", help="index for torch: pypi (default), cu128, or a URL")
    add_common(show)


def _target(args: argparse.Namespace) -> Target:
    from builder.user.targetenv import infer_archs, infer_cuda

    _check_cheap_flags(args)
    platform = _platform(args)  # first: an interpreter of another platform is refused before it is run
    cuda = validate_cuda(infer_cuda(args.cuda, args.python), settings_from_args(args))
    pure = _is_pure_python(getattr(args, "package", "") or getattr(args, "name", ""), args)
    archs = infer_archs(args.arch, required=not pure)
    jobs = args.jobs if getattr(args, "jobs", None) is not None else default_jobs()
    return Target(
        package=args.package if hasattr(args, "package") else args.name,
        version=args.version,
        cuda=cuda,
        archs=archs,
        python=args.python,
        torch=args.torch,
        torch_index=args.torch_index,
        toolchain=getattr(args, "toolchain", "auto"),
        source=getattr(args, "source", None),
        jobs=jobs,
        test_patches=tuple(getattr(args, "test_patch", []) or ()),
        abi=getattr(args, "abi", "auto"),
        platform=platform,
        subset=getattr(args, "subset", None),
    )


def _platform(args: argparse.Namespace) -> Platform:
    """--platform as given, else the --python env's machine (probed where it is a path), else this machine's."""
    text = getattr(args, "platform", None)
    if args.python.is_path:
        from builder.user.targetenv import env_platform

        found = env_platform(args.python.text)
        if found != this_machine():  # the build runs that interpreter: it must be one this machine runs
            raise UsageError(f"--python {args.python}: an {found} interpreter, which cannot run this machine's build",
                             f"cross-build with --platform {found} --python 3.X (a version: the build runs here, the "
                             f"import test in Debian's {found} Python under qemu)")
        if text and parse_platform(text) != found:
            raise UsageError(f"--platform {text} but --python {args.python} is an {found} interpreter",
                             "leave --platform out, or give --python a version")
        return found
    return parse_platform(text) if text else this_machine()


def _check_cheap_flags(args: argparse.Namespace) -> None:
    """Flags whose mistakes need no network or toolchain to see: checked before any work (plan reads PyPI)."""

    resolve_index(args.torch_index)
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1")
    for flag, value in (("--torch", args.torch), ("--version", args.version)):
        if value is None:
            continue
        try:
            Version(value)
        except InvalidVersion as e:
            raise UsageError(f"{flag} {value!r} is not a version", f"e.g. {flag} "
                             + ("2.11.0" if flag == "--torch" else "1.7.0")) from e
    python: PythonSpec = args.python
    if not python.is_path and not re.fullmatch(r"\d+\.\d+(\.\d+)?", python.text):
        raise UsageError(f"--python {python.text!r} is neither a Python version nor a path", "e.g. --python 3.12 or "
                         "--python /path/to/venv/bin/python")


def _is_pure_python(package: str, args: argparse.Namespace) -> bool:
    """Pure-Python recipes (fla) compile no GPU code, so --arch may be left out for them."""

    try:
        settings = settings_from_args(args)
        names = expand_name(package, settings.recipes_dir)
        return all(load_recipe(find_recipe(n, settings.recipes_dir), settings.patches_dir).kind
                   is RecipeKind.PURE_PYTHON for n in names)
    except BuilderError:
        return False


def cmd_build(args: argparse.Namespace) -> int:
    from builder.pipeline.run import BuildOptions, run_build

    start = time.monotonic()
    options = BuildOptions(
        force=args.force,
        kernel_tests=not args.no_kernel_tests,
        require_kernel_tests=args.require_kernel_tests,
        quick_kernel_tests=args.quick,
        keep_workdir=args.keep_workdir,
        stage=args.stage,
        compiler_cache=args.compiler_cache,
        replace=args.replace,
        torch_range=not args.no_torch_range,
        variants=args.variants,
    )
    settings = settings_from_args(args)
    _check_cheap_flags(args)
    from builder.pipeline.resolveinputs import check_edges
    from builder.user.targetenv import check_python_flag  # here: `builder build` startup (issue 19)

    packages = expand_name(args.package, settings.recipes_dir)
    for package in packages:  # a wheelhouse that is a file, kernel tests a folder, no cached list offline: before
        check_edges(package, settings, source=args.source)  # anything is asked (below, identity/ is written)
    # also for docker: the import and kernel tests run on a host interpreter
    check_python_flag(args.python, memo_dir(settings))
    targets = []
    for package in packages:
        args.package = package
        targets.append(_target(args))  # every flag of every target checked before the first build starts
    for target in targets:
        result = run_build(target, settings, options)
        elapsed = time.monotonic() - start
        tests = result.record.tests if result.record is not None else None
        out.print(f"[bold]{result.status}[/bold]: {result.wheel}  ({elapsed:.0f}s)")
        if tests is not None:
            out.print(f"tests: import {tests.import_status}, kernel {tests.kernel_status}"
                      + (f" ({tests.kernel_reason})" if tests.kernel_reason else ""))
        out.print("time per step: " + (", ".join(f"{step} {seconds:.1f}s" for step, seconds in result.timings.items())
                                         or "none recorded"), markup=False)
        if result.wheel is not None and result.status != "failed":
            out.print(f"next: {next_step(result, options)}", markup=False)
    return 0


def next_step(result: BuildResult, options: BuildOptions) -> str:
    """What a user does with the wheel a build made (issue 55 item 8: the build ended on a raw timings line)."""
    record, name = result.record, result.plan.recipe.name
    if record is not None and record.subset is not None:
        return (f"a [[subset]] build ({record.subset}) is for tests only and is never published; build without "
                "--subset for a wheel to install")
    if options.stage:
        return (f"on a GPU machine, builder test {result.wheel} --require-kernel-tests promotes it into the index "
                "once its kernel tests pass")
    return (f"builder install {name} --python <your env's python> (it keeps that env's torch; doctor says what fits); "
            "uv/pip by hand: README \"Installing what it built\"")


def cmd_test(args: argparse.Namespace) -> int:
    from builder.index.store import Wheelhouse
    from builder.pipeline.promote import TestOptions, resolve_wheels, test_wheel

    settings = settings_from_args(args)
    options = TestOptions(python=args.python, require_kernel_tests=args.require_kernel_tests, quick=args.quick,
                          bench=not args.no_bench, promote=not args.no_promote,
                          with_wheels=tuple(args.with_wheels), sanitize=args.sanitize)
    if args.sanitize:  # before any venv is made: a machine without the tool says so at once
        from builder.stages.sanitizer import find_sanitizer

        find_sanitizer(args.sanitize)
    for wheel in resolve_wheels(args.wheel, Wheelhouse(settings.wheelhouse)):
        report = test_wheel(wheel, settings, options)
        out.print(f"[bold]{wheel.name}[/bold]: {report.summary()}")
        for row in report.speed:
            out.print(f"  speed {row.get('name')}: {_speed_text(row)}", markup=False)
    return 0


def cmd_variants(args: argparse.Namespace) -> int:
    from builder.pipeline.builtvariants import stage_variants

    for wheel in stage_variants(args.wheel, settings_from_args(args), args.arch):
        out.print(f"[bold]staged[/bold]: {wheel}")
    return 0


def _speed_text(row: Mapping[str, Any]) -> str:
    """'kernel 1.337 ms, reference 755.2 ms, x565' or the benchmark's error."""
    if row.get("error") or not isinstance(row.get("kernel_ms"), (int, float)):
        return f"not measured: {row.get('error', 'no number')}"
    return (f"kernel {row['kernel_ms']:.3f} ms, reference {row['reference_ms']:.1f} ms, x{row['speedup']:.1f}"
            + (f", {row['kernel_gbps']:.0f} GB/s" if isinstance(row.get("kernel_gbps"), (int, float)) else ""))


def cmd_plan(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    plan = make_plan(_target(args), settings)
    _print_plan(plan.describe(buildable_here(plan, settings)))
    return 0  # a plan, also when this machine cannot build it: the row says so


def buildable_here(plan: Plan, settings: Settings) -> str:
    """The plan's "buildable here" row: yes and with what, or no, why and the ways forward. Probes only
    (interpreter lookup, engine ping, nvcc --version, the toolkit cache): nothing is provisioned or pulled."""
    from builder.user.targetenv import check_python_flag

    try:
        check_python_flag(plan.target.python, memo_dir(settings))
    except UsageError as e:
        return f"no: {e.message}"
    if not plan.recipe.kind.is_cuda:
        return "yes: pure Python, no CUDA compiler needed"
    return probe_build_here(plan.target.toolchain, plan.cuda, settings, os.environ,
                            components=plan.recipe.cuda_components).text()


def _print_plan(rows: list[tuple[str, str]]) -> None:
    table = Table(show_header=False, box=None)
    for key, value in rows:
        table.add_row(escape(key), escape(value))  # plain text: "[stable-abi]" is a recipe's section, not markup
    out.print(table)


def cmd_recipes(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.recipes_command == "show":
        args.package = args.name
        target = _target(args)
        recipe = load_target_recipe(target, settings)
        out.print(f"[bold]{recipe.name}[/bold]  ({recipe.file})")
        out.print(f"  kind: {recipe.kind}; supported versions: {recipe.versions}")
        out.print(f"  imports: {', '.join(recipe.imports)}; kernel tests: {recipe.kernel_tests or 'none'}")
        for patch in recipe.patches:
            out.print(f"  patch {patch.name} for {patch.versions}{' (test only)' if patch.test_only else ''}: {patch.summary}")
        out.print("resolved for this target:")
        plan = make_plan(target, settings)
        _print_plan(plan.describe(buildable_here(plan, settings)))
        return 0
    table = Table("recipe", "kind", "versions", "patches", "summary")
    for path in list_recipes(settings.recipes_dir):
        recipe = load_recipe(path, settings.patches_dir)
        table.add_row(recipe.name, recipe.kind, str(recipe.versions), str(len(recipe.patches)), recipe.summary)
    out.print(table)
    return 0


SOURCE_SCHEMES = ("https", "http", "file")  # an archive URL (the source stage's downloader)
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")


def source_location(text: str) -> str:
    """``--source``, checked at parse (before a cache folder, a venv or a download): a git+URL with a scheme git
    fetches, an archive URL with one the downloader reads, or a local path that exists."""
    url = text[4:] if text.startswith("git+") else text
    if "://" in url:
        scheme = url.split("://", 1)[0].lower()
        allowed = GIT_SCHEMES if text.startswith("git+") else SOURCE_SCHEMES
        if scheme not in allowed or not url.split("://", 1)[1].strip("/"):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a source URL: the scheme must be one of {', '.join(allowed)}"
                + (" (after git+)" if text.startswith("git+") else " (or git+URL for a repository)"))
        return text
    if text.startswith("git+"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a git URL (git+https://host/repo[@ref])")
    if not text.strip() or not Path(text).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file or folder (a local source is a path that exists: "
                                         "an sdist or a source tree)")
    return text


def cmd_inspect(args: argparse.Namespace) -> int:
    from builder.index.store import Wheelhouse
    from builder.stages.inspection import inspect_wheel, render_report

    if not args.wheel.is_file():
        raise UsageError(f"{args.wheel}: no such wheel file")
    report = inspect_wheel(args.wheel, settings_from_args(args))
    try:
        published = Wheelhouse.holding(args.wheel.resolve()).record_json(args.wheel.name)
    except (OSError, ValueError, RecursionError):  # unreadable or not JSON: inspect the wheel without its tests
        published = None
    tests = published.get("tests") if published else None
    if args.json:
        print(json.dumps({**report.as_dict(), "tests": tests}, indent=2))
        return 0
    out.print(render_report(report), markup=False)
    if tests:
        out.print(f"  tests (wheelhouse record): import {tests.get('import_status')}; kernel {tests.get('kernel_status')}"
                  + (f" ({tests.get('kernel_reason')})" if tests.get("kernel_reason") else "")
                  + (f" {tests.get('counts')}" if tests.get("counts") else ""), markup=False)
        for row in tests.get("speed") or []:
            out.print(f"  speed {row.get('name')}: x{row.get('speedup')} vs torch reference", markup=False)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from builder.pipeline.verify import stable_packages, verify_package

    settings = settings_from_args(args)
    packages = args.package or stable_packages(settings)
    if not packages:
        out.print("no stable-ABI or pure-Python wheels in the wheelhouse: nothing to verify")
        return 0
    results = [r for package in packages for r in verify_package(package, settings, python=args.python, pre=args.pre)]
    table = Table("wheel", "torch", "CUDA", "Python", "how", "result")
    for result in results:
        for check in result.checks:
            table.add_row(result.wheel, check.torch, check.cuda, check.python, check.how,
                          check.status + (" (new)" if check in result.new else ""))
    out.print(table)
    return 1 if any(not c.passed for r in results for c in r.new) else 0


COMMANDS = {
    "build": cmd_build,
    "verify": cmd_verify,
    "plan": cmd_plan,
    "test": cmd_test,
    "variants": cmd_variants,
    "recipes": cmd_recipes,
    "inspect": cmd_inspect,
}
