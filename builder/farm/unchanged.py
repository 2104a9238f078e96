"""What the wheelhouse already holds: which farm targets need no build.

Both checks compare a target's inputs (stages/inputs.py, the one definition of what the cache key covers), resolved
as the build resolves them (pipeline/resolveinputs.py):

- ``find_unchanged`` (``builder farm``, before any worker starts) resolves every part of the inputs offline with
  ``resolve_inputs`` itself, memoised per toolkit, build venv and source, and looks the real cache key up;
- ``changed_targets`` (``builder matrix --changed``, on a CPU runner with no toolkit and no build venv) compares
  the parts it can know (``known_inputs``) with each wheelhouse record's (``TargetInputs.agrees``; stages/inputs.py
  says why that is safe).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError, SourceError
from builder.core.settings import Settings
from builder.farm.spec import FarmTarget
from builder.index.store import Wheelhouse
from builder.model.python import PythonSpec
from builder.model.records import BuildRecord
from builder.pipeline.resolveinputs import InputsMemo, Undecided, resolve_inputs
from builder.pipeline.resolveinputs import known_inputs as known_plan_inputs
from builder.stages.inputs import TargetInputs, recorded_inputs
from builder.stages.plan import Plan, make_plan


def wheelhouse_records(root: Path, *, staging: bool = True) -> list[BuildRecord]:
    """Every readable build record of wheels that exist (published, and staged unless ``staging=False``)."""
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
    return known_plan_inputs(_offline_plan(target, settings))


def record_matches(record: BuildRecord, target: FarmTarget, inputs: TargetInputs) -> bool:
    """Same wheel (package, version, platform, Python minor, torch) built from inputs that agree with ``inputs``
    (a pure-Python wheel serves every platform: its record names none)."""
    try:
        same_wheel = (
            canonicalize_name(record.package) == canonicalize_name(target.package)
            and (not target.kind.is_cuda or record.target_platform == target.platform.name)
            and Version(record.version) == Version(target.version)
            and _python_matches(str(record.build_python), target.python)
            and record.build_torch is not None and record.build_torch.public == Version(target.torch).public
        )
        return same_wheel and inputs.agrees(recorded_inputs(record))
    except (InvalidVersion, KeyError, TypeError, AttributeError):
        return False


def _python_matches(recorded: str, wanted: PythonSpec) -> bool:
    if wanted.is_path:
        return True  # an interpreter path: its version is known only by running it
    return recorded == wanted.text or recorded.startswith(wanted.text + ".")


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


@dataclass(frozen=True)
class Unchanged:
    wheel: Path
    cache_key: str
    seconds: float  # time this target's decision took


def _published_keys(house: Wheelhouse, stage: bool) -> set[str]:
    areas = [house, house.staging()] if stage else [house]
    return {r.cache_key for area in areas for r in wheelhouse_records(area.root, staging=False) if r.cache_key}


def find_unchanged(targets: list[FarmTarget], settings: Settings, *, stage: bool = False) -> dict[str, Unchanged]:
    """Targets whose real cache key (the pipeline's, over every input) has a wheel in the wheelhouse.

    Anything that cannot be decided from what is cached without a side effect (a venv not created yet, a source
    not downloaded, a ``--python`` lacking build requirements, a toolchain that fails or may be a container) is
    left to the worker, whose run_build decides again with the same key.
    """
    house = Wheelhouse(settings.wheelhouse)
    keys = _published_keys(house, stage)
    if not keys:
        return {}
    environ = dict(os.environ)
    found: dict[str, Unchanged] = {}
    with InputsMemo.for_check() as memo:  # shared: one toolchain selection per toolkit, one look per venv
        for farm_target in targets:
            start = time.monotonic()
            offline = dataclasses.replace(farm_target.settings(settings), offline=True)
            try:
                key = resolve_inputs(make_plan(farm_target.to_target(1), offline), offline, environ, memo).key
            except (BuilderError, Undecided):
                continue
            if key not in keys:
                continue
            # verified like the pipeline's own check: the wheel's bytes match its record and the pages list it
            verified = house.find_record(key) or (house.staging().find_record(key) if stage else None)
            if verified:
                found[farm_target.id] = Unchanged(verified[0], key, round(time.monotonic() - start, 2))
    return found
