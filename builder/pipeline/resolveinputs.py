"""A target's inputs, resolved in one order by one function: toolchain → source (and the patches' drift check) →
Python → host compiler → the inputs and their cache key (stages/inputs.py says what the key covers).

Its three users share it, so that they cannot drift apart:

- ``run_build`` (pipeline/run.py) resolves one target with a fresh ``InputsMemo`` and builds on what it gets;
- the farm's up-front check (farm/unchanged.py ``find_unchanged``) resolves every target with offline settings and
  one ``InputsMemo.for_check()``: one toolchain selection (one ``nvcc --version``) per toolkit, one look at each
  build venv and source, no container opened and no patch dry run. Whatever cannot be known without a side effect
  (a container, a download, an install) raises ``Undecided`` or a BuilderError: the worker's build decides;
- ``builder matrix --changed`` (``known_inputs``) on a CPU runner with no toolkit and no build venv: the same
  inputs, with the parts only those could tell UNKNOWN.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from builder.core.errors import RecipeError, UsageError
from builder.core.fsutil import sha256_file, tree_digest
from builder.core.log import log
from builder.core.settings import Settings
from builder.model.recipe import find_recipe, load_recipe
from builder.stages.compile import base_env
from builder.stages.inputs import UNKNOWN, TargetInputs, Unknown, target_inputs, toolkit_record
from builder.stages.patch import check_patches
from builder.stages.plan import Plan
from builder.stages.pyenv import PythonEnv, python_for
from builder.stages.resolve import SourceRef, pypi_releases
from builder.stages.source import describe_source_digest, fetch
from builder.toolchain import CudaToolkit, cross, select_toolkit
from builder.toolchain.base import BuildHost
from builder.toolchain.local import LOCAL
from builder.toolchain.select import may_use_container


class Undecided(Exception):
    """The farm's check cannot resolve this target without a side effect (a container); the worker decides."""


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        timings[stage] = round(time.monotonic() - start, 2)


@dataclass(frozen=True)
class ResolvedInputs:
    """Everything the build of one target works from that its cache key covers."""

    plan: Plan
    host: BuildHost  # where the build's commands run; its toolkit is None for a pure-Python build
    source: Path  # the archive or tree, in the cache
    source_digest: str
    python: PythonEnv  # the build's Python, with the pinned torch
    test_python: Path  # the interpreter on this machine that the test venv starts from
    compiler: dict[str, str] | None  # the host C/C++ compiler (None: pure Python, or the toolkit brings its own)
    inputs: TargetInputs
    key: str  # inputs.cache_key()

    @property
    def toolkit(self) -> CudaToolkit | None:
        return self.host.toolkit


PythonKey = tuple[str, str, str | None, str, tuple[str, ...], str]
CompilerKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class InputsMemo:
    """What resolving one target learned that the next one can use, and the build hosts opened meanwhile (closed
    with the memo). ``check``: the farm's up-front check (no container, no patch dry run: see the module)."""

    check: bool = False
    hosts: dict[tuple[str, str, tuple[str, ...], bool], BuildHost | None] = field(default_factory=dict)  # (toolchain, CUDA,
    # the recipe's CUDA components); None: failed
    containers: dict[str, bool] = field(default_factory=dict)  # per toolchain name: may it pick a container here?
    sources: dict[SourceRef, tuple[Path, str]] = field(default_factory=dict)
    pythons: dict[PythonKey, tuple[PythonEnv, Path]] = field(default_factory=dict)
    compilers: dict[CompilerKey, dict[str, str] | None] = field(default_factory=dict)  # per host and recipe env

    @classmethod
    def for_check(cls) -> InputsMemo:
        return cls(check=True)

    def __enter__(self) -> InputsMemo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        hosts, self.hosts = self.hosts, {}
        for host in hosts.values():
            if host is not None:
                host.close()


def resolve_inputs(plan: Plan, settings: Settings, environ: Mapping[str, str], memo: InputsMemo, *,
                   timings: dict[str, float] | None = None) -> ResolvedInputs:
    """Resolve every input of ``plan`` (logged as the build's steps, timed into ``timings``). The build host it
    opens belongs to ``memo``: use the result inside ``with memo``."""
    timings = {} if timings is None else timings
    host = _host(plan, settings, environ, memo, timings)
    # the source first: a bad checksum or URL fails in seconds, before gigabytes of torch are installed
    source, digest = _source(plan, settings, memo, timings)
    python, test_python = _python(plan, settings, host, memo, timings)
    compiler = _compiler(plan, environ, host, memo)
    inputs = _inputs(plan, source_digest=digest, toolkit=host.toolkit, python=python, compiler=compiler)
    return ResolvedInputs(plan, host, source, digest, python, test_python, compiler, inputs, inputs.cache_key())


def check_edges(package: str, settings: Settings, *, source: str | None = None) -> None:
    """What a build would otherwise find wrong only at its end, checked before anything is made (no identity file,
    venv, download or stage): the wheelhouse must be a folder this process can write into (or make), the recipe's
    ``[test] kernel-tests``, where it names something that exists, a regular file (a missing one is allowed: the
    test stage skips it, and `plan` works before it is written), and ``--offline`` needs the cached release list
    (before: nvcc and the interpreters were asked, and their answers written to identity/, first). ``source``: the
    build's --source, which needs no release list."""
    check_wheelhouse_writable(settings.wheelhouse)
    recipe = load_recipe(find_recipe(package, settings.recipes_dir), settings.patches_dir)  # as written:
    # (load_target_recipe's stable-ABI floor reads discovery's listing, which may fetch)
    tests = recipe.kernel_tests
    if tests is not None and os.path.lexists(tests) and not tests.is_file():
        what = "a folder" if tests.is_dir() else "not a regular file (a dangling link, a fifo, a device)"
        raise RecipeError(f"{recipe.file}: field 'test.kernel-tests' names {tests}, which is {what}",
                          "point it at the kernel-test script beside the recipe (a .py file)")
    if settings.offline and source is None and recipe.source.path is None and recipe.source.git is None:
        pypi_releases(recipe.source.pypi or recipe.name, settings)  # no cached list: refused before any probe writes


def check_wheelhouse_writable(root: Path) -> None:
    """The wheelhouse a build publishes to is a folder a file can be written in, or a folder can be made at: tried
    with a temp file of the builder's own naming, removed at once (a read-only mount refuses even root)."""
    where = f"--wheelhouse {root}"
    cure = "give a folder you can write (--wheelhouse or BUILDER_WHEELHOUSE); it is made when missing"
    if os.path.lexists(root) and not root.is_dir():
        raise UsageError(f"{where}: is a file, not a folder", cure)
    folder = root
    while not folder.is_dir():
        if os.path.lexists(folder) and not folder.is_dir():
            raise UsageError(f"{where}: cannot be made, {folder} is a file", cure)
        folder = folder.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".builder-tmp")
    except OSError as e:
        made = "" if folder == root else f" (it would be made in {folder})"
        raise UsageError(f"{where}: cannot be written{made}: {e.strerror or e}", cure) from e
    os.close(fd)
    os.unlink(tmp)


def known_inputs(plan: Plan) -> TargetInputs:
    """The inputs ``resolve_inputs`` gives, as far as a machine without a toolkit or build venv knows them
    (``builder matrix --changed``): the toolkit, the build venv and the host compiler UNKNOWN (None where a
    pure-Python build has none), and the source's digest only where it is known without fetching."""
    cuda = plan.recipe.kind.is_cuda
    return _inputs(plan, source_digest=_known_digest(plan.source), toolkit=UNKNOWN if cuda else None, python=UNKNOWN,
                   compiler=UNKNOWN if cuda else None)


def _inputs(plan: Plan, *, source_digest: str | Unknown, toolkit: CudaToolkit | None | Unknown,
            python: PythonEnv | Unknown, compiler: Mapping[str, str] | None | Unknown) -> TargetInputs:
    record = toolkit if isinstance(toolkit, Unknown) else toolkit_record(plan, toolkit)
    return target_inputs(plan, source_digest=source_digest, toolkit=record, python=python, compiler=compiler)


def _host(plan: Plan, settings: Settings, environ: Mapping[str, str], memo: InputsMemo,
          timings: dict[str, float]) -> BuildHost:
    """Where the build runs: this machine for pure Python, else the selected toolchain's host."""
    if not plan.recipe.kind.is_cuda:
        return LOCAL  # without a CUDA toolkit
    here_only = cross.is_cross(plan.target.platform)  # a cross build: this machine's toolkit, never a container's
    key = (plan.target.toolchain, str(plan.cuda), plan.recipe.cuda_components, here_only)
    if key in memo.hosts:
        known = memo.hosts[key]
        if known is None:
            raise Undecided
        return known
    memo.hosts[key] = None  # until it is selected
    if memo.check and not here_only and _may_use_container(plan.target.toolchain, environ, memo):
        raise Undecided  # its toolkit and Python live in an image that would have to be opened
    _step(memo, "toolchain")
    with timed(timings, "toolchain"):
        choice = select_toolkit(plan.target.toolchain, plan.cuda, settings, environ,
                                components=plan.recipe.cuda_components, here_only=here_only)
    assert choice.host is not None and choice.toolkit is not None
    memo.hosts[key] = choice.host
    if not memo.check:
        log.info(f"toolchain: {choice.toolkit.describe()} — {choice.toolkit.reason}")
    return choice.host


def _step(memo: InputsMemo, name: str) -> None:
    """A build's step header; the farm's up-front check over many targets prints none."""
    if not memo.check:
        log.step(name)


def _may_use_container(toolchain: str, environ: Mapping[str, str], memo: InputsMemo) -> bool:
    if toolchain not in memo.containers:
        memo.containers[toolchain] = may_use_container(toolchain, environ)
    return memo.containers[toolchain]


def _source(plan: Plan, settings: Settings, memo: InputsMemo, timings: dict[str, float]) -> tuple[Path, str]:
    """The fetched source and its digest; then the build dry-runs the patches on it, so that drift stops the build
    now (not an input, so the farm's check does not)."""
    if plan.source not in memo.sources:
        _step(memo, "source")
        with timed(timings, "source"):
            path, digest = memo.sources[plan.source] = fetch(plan.source, settings)
        if not memo.check:
            log.info(f"source: {path.name} {describe_source_digest(plan.source.kind, digest)}")
    path, digest = memo.sources[plan.source]
    if not memo.check:
        check_patches(path, plan.patches, plan.recipe.name, plan.version, settings.cache("builds"))
    return path, digest


def _python(plan: Plan, settings: Settings, host: BuildHost, memo: InputsMemo,
            timings: dict[str, float]) -> tuple[PythonEnv, Path]:
    """The build's Python and the test venv's base interpreter (stages/pyenv.py ``python_for``)."""
    key = (host.where, str(plan.target.python), plan.torch, plan.index.url, tuple(plan.recipe.build_requires),
           str(plan.cuda))
    if key not in memo.pythons:
        _step(memo, "python")
        with timed(timings, "python"):
            memo.pythons[key] = python_for(plan, settings, host)
    return memo.pythons[key]


def _compiler(plan: Plan, environ: Mapping[str, str], host: BuildHost, memo: InputsMemo) -> dict[str, str] | None:
    """The host C/C++ compiler a CUDA build on ``host`` uses (None for pure Python and where the toolkit brings
    its own compiler: container builds)."""
    if host.toolkit is None:
        return None
    key = (host.where, tuple(sorted(plan.env.items())))
    if key not in memo.compilers:
        memo.compilers[key] = host.host_compiler({**base_env(dict(environ)), **plan.env})
    return memo.compilers[key]


def _known_digest(ref: SourceRef) -> str | Unknown:
    """The source's digest without fetching: a local path's (as ``fetch`` computes it), else the recorded sha256;
    a git source's pinned commit (an unpinned one is known only after cloning)."""
    if ref.kind == "path":
        path = Path(ref.location)
        return tree_digest(path) if path.is_dir() else sha256_file(path)
    if ref.kind == "git":
        return ref.commit or UNKNOWN  # a pinned commit is what the clone is checked against
    return ref.sha256 or UNKNOWN
