"""What the wheelhouse already holds: which farm targets need no build.

Both checks compare a target's inputs (stages/inputs.py, the one definition of what the cache key covers):

- ``find_unchanged`` (``builder farm``, before any worker starts) resolves every part of the inputs offline with
  the pipeline's own functions, memoised per toolkit, build venv and source, and looks the real cache key up;
- ``changed_targets`` (``builder matrix --changed``, on a CPU runner with no toolkit and no build venv) compares
  the parts it can know with each wheelhouse record's (``TargetInputs.agrees``; inputs.py says why that is safe).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.cachedir import memo_dir
from builder.core.errors import BuilderError, SourceError
from builder.core.settings import Settings
from builder.farm.spec import FarmTarget, is_interpreter_path
from builder.model.records import BuildRecord
from builder.stages.inputs import UNKNOWN, TargetInputs, recorded_inputs, target_inputs
from builder.stages.plan import Plan, make_plan


def wheelhouse_records(root: Path, *, staging: bool = True) -> list[BuildRecord]:
    """Every readable build record of wheels that exist (published, and staged unless ``staging=False``)."""
    from builder.index.store import Wheelhouse

    house = Wheelhouse(root)
    records = []
    for area in [house, house.staging()] if staging else [house]:
        if not area.records.is_dir():
            continue
        for path in sorted(area.records.glob("*.whl.json")):
            name = path.name.removesuffix(".json")
            try:
                record = area.record_of(name)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if record is not None and (area.wheels / name).exists():
                records.append(record)
    return records


# ---------------------------------------------------------------- matrix --changed: the inputs a CPU runner knows


def _offline_plan(target: FarmTarget, settings: Settings) -> Plan:
    target_settings = target.settings(settings)
    try:  # the release list expand() fetched is in the cache: no request per target
        return make_plan(target.to_target(1), dataclasses.replace(target_settings, offline=True))
    except SourceError:
        return make_plan(target.to_target(1), target_settings)


def known_inputs(target: FarmTarget, settings: Settings) -> TargetInputs:
    """The target's inputs without a toolkit or build venv: those parts (and a git source's digest) UNKNOWN."""
    from builder.core.fsutil import sha256_file, tree_digest

    plan = _offline_plan(target, settings)
    digest: Any = plan.source.sha256 or UNKNOWN
    if plan.source.kind == "path":
        path = Path(plan.source.location)
        digest = tree_digest(path) if path.is_dir() else sha256_file(path)
    elif plan.source.kind == "git":
        digest = UNKNOWN  # its commit is known only after cloning
    cuda_ext = plan.recipe.kind == "cuda-extension"
    return target_inputs(plan, source_digest=digest, toolkit=UNKNOWN if cuda_ext else None, python=UNKNOWN,
                         compiler=UNKNOWN if cuda_ext else None)


def record_matches(record: BuildRecord, target: FarmTarget, inputs: TargetInputs) -> bool:
    """Same wheel (package, version, Python minor, torch) built from inputs that agree with ``inputs``."""
    try:
        same_wheel = (
            canonicalize_name(record.package) == canonicalize_name(target.package)
            and Version(record.version) == Version(target.version)
            and _python_matches(str(record.python.get("version")), target.python)
            and Version(str(record.python.get("torch"))).public == Version(target.torch).public
        )
        return same_wheel and inputs.agrees(recorded_inputs(record))
    except (InvalidVersion, KeyError, TypeError, AttributeError):
        return False


def _python_matches(recorded: str, wanted: str) -> bool:
    if is_interpreter_path(wanted):
        return True  # an interpreter path: its version is known only by running it
    return recorded == wanted or recorded.startswith(wanted + ".")


def changed_targets(targets: list[FarmTarget], settings: Settings) -> list[FarmTarget]:
    """The targets that no wheelhouse record matches (``record_matches``)."""
    by_package: dict[str, list[BuildRecord]] = {}
    for record in wheelhouse_records(settings.wheelhouse):
        by_package.setdefault(canonicalize_name(record.package), []).append(record)
    changed = []
    for target in targets:
        candidates = by_package.get(canonicalize_name(target.package), [])
        if not candidates:
            changed.append(target)
            continue
        inputs = known_inputs(target, settings)
        if not any(record_matches(r, target, inputs) for r in candidates):
            changed.append(target)
    return changed


# ---------------------------------------------------------------- the exact "unchanged" check, before any worker


class _Undecided(Exception):
    """The up-front check cannot decide this target without side effects; the worker decides."""


@dataclass(frozen=True)
class Unchanged:
    wheel: Path
    cache_key: str
    seconds: float  # time this target's decision took


def _published_keys(house: Any, stage: bool) -> set[str]:
    areas = [house, house.staging()] if stage else [house]
    return {r.cache_key for area in areas for r in wheelhouse_records(area.root, staging=False) if r.cache_key}


class _Resolver:
    """The parts of a target's inputs, resolved offline with the pipeline's functions and memoised, so N
    unchanged targets cost one ``nvcc --version`` per toolkit and one torch probe per build venv."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ
        self.toolkits: dict[tuple[str, str], Any] = {}
        self.envs: dict[tuple[Any, ...], Any] = {}
        self.sources: dict[tuple[str, str], str] = {}
        self.compilers: dict[str, dict[str, str] | None] = {}  # per recipe env (a recipe may set CXX)
        self.container: dict[str, bool] = {}  # memo per toolchain name: may it build in a container here?

    def toolkit(self, plan: Plan, offline: Settings) -> Any:
        key = (plan.target.toolchain, str(plan.cuda))
        if key not in self.toolkits:
            try:
                self.toolkits[key] = self._select(plan, offline)
            except (_Undecided, BuilderError):
                self.toolkits[key] = None
        if self.toolkits[key] is None:
            raise _Undecided
        return self.toolkits[key]

    def _select(self, plan: Plan, offline: Settings) -> Any:
        # A container build's toolkit and Python live in the image: leave those targets to the worker.
        from builder.toolchain import select_toolkit
        from builder.toolchain.select import may_use_container

        toolchain = plan.target.toolchain
        if toolchain not in self.container:
            self.container[toolchain] = may_use_container(toolchain, self.environ)
        if self.container[toolchain]:
            raise _Undecided
        choice = select_toolkit(toolchain, plan.cuda, offline, self.environ)
        if choice.host is not None:
            choice.host.close()
        return choice.toolkit

    def inputs(self, plan: Plan, offline: Settings) -> TargetInputs:
        from builder.pipeline.run import compiler_identity, python_env_for, toolkit_record
        from builder.stages.source import fetch
        from builder.toolchain.local import LocalRunner

        toolkit = self.toolkit(plan, offline) if plan.recipe.kind == "cuda-extension" else None
        env_key = (plan.target.python, plan.torch, plan.index.url, plan.recipe.build_requires)
        if env_key not in self.envs:
            self.envs[env_key] = python_env_for(plan, offline)[0]
        src_key = (plan.source.kind, plan.source.location)
        if src_key not in self.sources:
            self.sources[src_key] = fetch(plan.source, offline)[1]
        cc_key = json.dumps(sorted(plan.env.items())) if toolkit is not None else ""
        if cc_key not in self.compilers:
            host = LocalRunner(toolkit, memo=memo_dir(offline))
            self.compilers[cc_key] = compiler_identity(plan, self.environ, host)
        return target_inputs(plan, source_digest=self.sources[src_key], toolkit=toolkit_record(plan, toolkit),
                             python=self.envs[env_key], compiler=self.compilers[cc_key])


def find_unchanged(targets: list[FarmTarget], settings: Settings, *, stage: bool = False) -> dict[str, Unchanged]:
    """Targets whose real cache key (the pipeline's, over every input) has a wheel in the wheelhouse.

    Anything that cannot be decided from what is cached (a venv not created yet, a source not downloaded, a
    toolchain that fails) is left to the worker, whose run_build decides again with the same key.
    """
    from builder.index.store import Wheelhouse

    house = Wheelhouse(settings.wheelhouse)
    keys = _published_keys(house, stage)
    if not keys:
        return {}
    resolver = _Resolver(dict(os.environ))
    found: dict[str, Unchanged] = {}
    for farm_target in targets:
        start = time.monotonic()
        offline = dataclasses.replace(farm_target.settings(settings), offline=True)
        try:
            key = resolver.inputs(make_plan(farm_target.to_target(1), offline), offline).cache_key()
        except (BuilderError, _Undecided):
            continue
        if key not in keys:
            continue
        # verified like the pipeline's own check: the wheel's bytes match its record and the pages list it
        verified = house.find_record(key) or (house.staging().find_record(key) if stage else None)
        if verified:
            found[farm_target.id] = Unchanged(verified[0], key, round(time.monotonic() - start, 2))
    return found
