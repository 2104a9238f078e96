"""`builder test`: test an existing wheel on this machine and, when it lives in the staging area and passes,
promote it into the published index. This is the second half of the two-stage farm flow: CPU builders build and
import-test into staging; GPU machines kernel-test and promote."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import ToolchainError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.wheelfile import check_wheel_file, parse_wheel_name
from builder.discovery.compat import resolve_index
from builder.index.store import Wheelhouse
from builder.model.builtwheel import BuiltWheel
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.model.records import BuildRecord, TestReport
from builder.model.wheelfacts import torch_requirement
from builder.pipeline import checks
from builder.pipeline.chain import Checked, Step, run_chain
from builder.stages.pyenv import PythonEnv, find_interpreter, fresh_test_env, probe
from builder.stages.testing import KernelTestPlan, TestStageFailed, run_tests
from builder.stages.torchrange import PurePython


@dataclass(frozen=True, kw_only=True)
class TestOptions:
    __test__ = False  # not a pytest class

    python: str | None = None  # an interpreter whose torch is used (offline GPU machines); None: fresh venv
    require_kernel_tests: bool = False
    quick: bool = False
    bench: bool = True
    promote: bool = True
    with_wheels: tuple[Path, ...] = ()  # installed beside the wheel (e.g. causal-conv1d + fla for the fast-path check)
    sanitize: str | None = None  # the --quick kernel tests under this compute-sanitizer tool (memcheck, racecheck)


def resolve_wheels(spec: str, house: Wheelhouse) -> list[Path]:
    """A wheel path, or a package name: its wheels in staging (first) or in the published index."""
    path = Path(spec)
    if path.suffix == ".whl" or path.is_file():  # a file given by path is checked: a zip is not a wheel
        if not path.is_file():
            raise UsageError(f"{spec}: no such wheel file")
        check_wheel_file(path)
        return [path]

    wanted = canonicalize_name(spec)
    for area in (house.staging(), house):
        found = [w for w in sorted(area.wheels.glob("*.whl")) if canonicalize_name(parse_wheel_name(w.name)[0]) == wanted]
        if found:
            return found
    raise UsageError(f"no wheel of {spec!r} in {house.staging().wheels} or {house.wheels}")


def test_wheel(path: Path, settings: Settings, options: TestOptions) -> TestReport:
    """Inspect, import-test and kernel-test one wheel (the check chain's inspect → test → GPU check → publish,
    pipeline/chain.py); record the result; promote it from staging if it passed."""
    house = Wheelhouse(settings.wheelhouse)
    wheel = checks.read_wheel(path, house)  # the wheelhouse's record: earlier GPUs' reports and checks kept
    recipe = load_recipe(find_recipe(str(wheel.name), settings.recipes_dir), settings.patches_dir)
    workdir = Path(tempfile.mkdtemp(prefix=f"{wheel.name}-test-", dir=settings.cache("tests")))
    state = Checked(wheel, record=wheel.record or BuildRecord())
    try:
        run_chain(state, _test_steps(path, recipe, settings, options, house, workdir), announce=False)
    finally:
        shutil.rmtree(workdir / "test-venv", ignore_errors=True)
    assert state.tests is not None
    return state.tests


def _test_steps(path: Path, recipe: Recipe, settings: Settings, options: TestOptions, house: Wheelhouse,
                workdir: Path) -> dict[str, Step]:
    """``builder test``'s steps of the check chain: inspect (for the report: checked at build), test in an env of
    the wheel's torch (or ``--python``'s), this GPU's check for a ranged wheel, then publish: promoted when staged
    and passed, else the record kept where the wheel lies."""
    staging = house.staging()
    envs: list[PythonEnv] = []  # the test step's env, for the GPU check

    def inspect(state: Checked) -> None:
        state.report = checks.inspect(state.wheel, settings, verify=False)

    def test(state: Checked) -> None:
        assert state.report is not None and state.record is not None
        torch = _torch_pin(state.report.requires, state.record, ranged=state.wheel.ranged)
        kernel = KernelTestPlan(quick=options.quick, bench=options.bench, required=options.require_kernel_tests,
                                not_published="nothing was promoted", sanitize=options.sanitize)
        try:
            envs.append(_test_env(state.wheel, options, torch, workdir, requires=state.report.requires))
            state.tests = run_tests(envs[-1], recipe, state.report, workdir, kernel)
        except TestStageFailed as e:
            _save(state.record.with_tests(e.report), path, house, staging)
            raise
        state.record = state.record.with_tests(state.tests)

    def gpu_check(state: Checked) -> None:  # a ranged wheel's checks are per torch and GPU: another GPU adds its own
        assert state.tests is not None and state.record is not None
        if state.wheel.ranged and state.tests.kernel_status == "passed":
            state.record = state.record.with_(torch_checks=checks.with_gpu_check(state.record, envs[-1], state.tests))

    def publish(state: Checked) -> None:
        assert state.tests is not None and state.report is not None and state.record is not None
        passed = state.tests.kernel_status == "passed"
        if staging.contains(path) and options.promote and passed:
            state.published = checks.publish(house, state.wheel.with_record(state.record), state.report)
            staging.remove(path.name)
            log.ok(f"promoted into the published index: {state.published}")
            return
        if staging.contains(path):
            log.warning(f"not promoted: kernel tests {state.tests.kernel_status}"
                        + (f" ({state.tests.kernel_reason})" if state.tests.kernel_reason else "")
                        + "; it stays in staging")
        _save(state.record, path, house, staging)

    return {"inspect": inspect, "test": test, "gpu check": gpu_check, "publish": publish}


def _save(record: BuildRecord, wheel: Path, house: Wheelhouse, staging: Wheelhouse) -> None:
    for area in (staging, house):
        if area.contains(wheel):
            area.write_record(wheel.name, record)


def _torch_pin(requires: tuple[str, ...], record: BuildRecord, *, ranged: bool = False) -> str:
    """The torch to test with: a ``torch==X`` pin of its torch requirement (model/wheelfacts.py); for a
    per-torch wheel pinned to its minor (``torch>=2.9.0,<2.10``: every patch release) and a wheel offered across
    torches (``ranged``: a stable-ABI wheel, ``torch>=FLOOR``, or a pure-Python one built once, which keeps
    upstream's requirement) the torch it was built against, which its record names."""
    spec = torch_requirement(requires) or SpecifierSet()  # model/wheelfacts.py: the one rule
    pins = [s.version for s in spec if s.operator == "=="]
    if pins:
        return pins[0]
    minor_pin = any(s.operator == "<" for s in spec)
    built_with = record.build_torch if ranged or minor_pin else None  # ranged: stable-ABI among them
    if built_with:
        return str(built_with)
    raise UsageError("the wheel pins no torch== version; was it built by this tool?")


def _test_env(wheel: BuiltWheel, options: TestOptions, torch: str, workdir: Path, *,
              requires: tuple[str, ...] = ()) -> PythonEnv:
    if options.python is not None:
        # absolute: `./venv/bin/python` must not lose its ./ to Path() and be looked up on PATH
        given = probe(Path(shutil.which(options.python) or options.python).absolute(), need_torch=True)
        if wheel.stable:
            _check_stable_torch(given, wheel, options.python)
        elif wheel.built_once:
            _check_pure_torch(given, requires, options.python)
        else:
            _check_per_torch_torch(given, wheel, torch, options.python)
        return fresh_test_env(given.python, torch, resolve_index(None), wheel.path, _extra(options), workdir,
                              torch_from=given)
    interpreter = next((t.interpreter for t in wheel.tags if t.interpreter.startswith("cp")), "cp312")
    version = f"{interpreter[2]}.{interpreter[3:]}"
    if (wheel.built_once or any(t.abi == "abi3" for t in wheel.tags)) and wheel.build_python:
        version = wheel.build_python  # abi3 or py3: the Python it was built and tested with
    index = resolve_index((wheel.record.torch_index if wheel.record else "") or None)
    return fresh_test_env(find_interpreter(version), torch, index, wheel.path, _extra(options), workdir)


def _check_per_torch_torch(given: PythonEnv, wheel: BuiltWheel, torch: str, python: str) -> None:
    """A per-torch wheel runs with every patch release of the torch minor it was built against (its pin), built for
    its CUDA major (labelled ``cu12torch2.9``: any line of it, the check then counts for that line's channel) or for
    its CUDA line (an older ``cu128torch2.9`` label)."""
    built, have = Version(torch), Version(given.torch or "0")
    if have.release[:2] != built.release[:2]:
        raise ToolchainError(f"--python {python}: its torch is {given.torch}, the wheel needs torch "
                             f"{built.major}.{built.minor} (built against {built.public})",
                             f"give an interpreter with a torch {built.major}.{built.minor}.x")
    cuda, line = wheel.cuda, given.torch_cuda or ""
    if cuda is None or not line:
        return
    same = line.startswith(f"{cuda.major}.") if wheel.per_torch_major else line.startswith(f"{cuda.line}")
    if not same:
        wanted = f"CUDA {cuda.major}" if wheel.per_torch_major else f"CUDA {cuda.line}"
        raise ToolchainError(f"--python {python}: its torch {given.torch} is built for CUDA {line}; the wheel is for "
                             f"{wanted} torches", "give an interpreter with such a torch")


def _check_stable_torch(given: PythonEnv, wheel: BuiltWheel, python: str) -> None:
    """A stable-ABI wheel runs on a torch at or above its floor built for its CUDA major."""
    floor, cuda = wheel.torch_floor or Version("0"), wheel.cuda
    torch = Version(given.torch or "0")
    if torch.release[:2] < floor.release[:2]:
        raise ToolchainError(f"--python {python}: its torch is {given.torch}, below the wheel's floor torch>={floor}",
                             "give an interpreter with a newer torch")
    if cuda is not None and given.torch_cuda and not given.torch_cuda.startswith(f"{cuda.major}."):
        raise ToolchainError(f"--python {python}: its torch {given.torch} is built for CUDA {given.torch_cuda}; the "
                             f"wheel is for CUDA {cuda.major} torches", "give an interpreter with such a torch")


def _check_pure_torch(given: PythonEnv, requires: tuple[str, ...], python: str) -> None:
    """A pure-Python wheel built once runs with any torch its own requirement admits (its checks say where it is
    offered; this run adds one for that torch)."""
    claim = PurePython.of_requires(requires)
    if not claim.admits(given.torch or "0"):
        raise ToolchainError(f"--python {python}: its torch is {given.torch}; the wheel requires torch"
                             f"{claim.requirement}", "give an interpreter with a torch the wheel allows")


def _extra(options: TestOptions) -> tuple[str, ...]:
    for path in options.with_wheels:
        if not path.is_file():
            raise UsageError(f"--with {path}: no such wheel file")
    return tuple(str(p.resolve()) for p in options.with_wheels)
