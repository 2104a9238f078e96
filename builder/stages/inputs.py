"""A target's inputs: everything that can change its wheel, defined once, hashed into the cache key.

``target_inputs`` is the one function that says what the key covers. Its parts are resolved by one function,
pipeline/resolveinputs.py ``resolve_inputs``, for three callers:

- the build (pipeline/run.py) with the real source digest, toolkit, build venv and host compiler;
- the farm's up-front check (farm/unchanged.py) with the same parts resolved offline and memoised;
- ``builder matrix --changed`` (farm/unchanged.py, pipeline/resolveinputs.py ``known_inputs``) on a CPU runner that has
  no toolkit and no build venv: the parts it cannot know are ``UNKNOWN`` and ``agrees`` compares only the known
  fields with a record's.

Why the approximation of ``matrix --changed`` is safe enough: it only chooses which targets a CI run starts, and
every started target's ``builder build`` decides again with the full key. What it cannot see is a new toolkit
patch release, another Python patch release or another host compiler for an otherwise unchanged target; those
are rebuilt by the next plain ``builder farm`` run, whose check uses the full key. A new field added to
``TargetInputs`` is compared by default (a record without it disagrees), so no future input is silently ignored.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, cast

from builder import __version__
from builder.model.records import BuildRecord
from builder.stages.plan import Plan
from builder.stages.pyenv import PythonEnv
from builder.toolchain.base import CudaToolkit


class Unknown(enum.Enum):
    """A part of the inputs that cannot be known without a toolkit or build venv (``matrix --changed``)."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN
# The toolkit fields that go into the key: a container build's image tag hashes its Dockerfile template and build arguments
# (a new compiler there is a new tag); its content ID, the CUDA_HOME path and the reason do not. nvcc_flags: what
# the builder adds to every nvcc call (CudaToolkit.nvcc_flags; absent in records of builds that added none).
TOOLKIT_KEY_FIELDS = ("kind", "nvcc", "image", "nvcc_flags")
# Inputs that build records do not carry because another recorded input covers them: the recipe's build env is
# in the recipe, whose content digest is recorded.
COVERED_BY: Mapping[str, str] = {"env": "recipe"}

Pairs = tuple[tuple[str, str], ...]
BUILT_ONCE = "any (pure Python: built once)"  # a pure-Python wheel's torch, Python, index and CUDA in its cache key


@dataclass(frozen=True, kw_only=True)
class TargetInputs:
    """Everything that can change a target's wheel; equal inputs mean nothing needs building."""

    builder: str
    recipe: str  # the recipe's content digest (its parsed TOML: comments and layout do not count)
    patches: tuple[tuple[str, str], ...]  # (file name, sha256) in apply order
    source: str | Unknown  # sha256 of the archive or tree; UNKNOWN for a git source before it is cloned
    toolkit: Pairs | Unknown  # TOOLKIT_KEY_FIELDS of the toolkit's record; () for pure Python
    python: str | Unknown  # the build venv's full Python version
    torch: str | Unknown  # the build venv's torch version
    index: str
    archs: tuple[str, ...]  # () for pure Python
    cuda: str
    env: Pairs  # the recipe's build env
    compiler: Pairs | None | Unknown  # the host C/C++ compiler of a host-side CUDA build; None otherwise
    platform: str | None = None  # the wheel's CPU platform; None for x86_64, whose keys stay as they were

    def as_json(self) -> dict[str, Any]:
        """The inputs as the cache key hashes them (the layout the key had before this type existed)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Unknown):
                raise ValueError(f"the cache key needs {f.name}, which is unknown here")
            if f.name in ("compiler", "platform") and value is None:
                continue  # absent for pure-Python and container builds, whose keys stay as they were
            out[f.name] = _jsonable(f.name, value)
        return out

    def cache_key(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()

    def agrees(self, other: TargetInputs) -> bool:
        """Equal in every field both sides know (``UNKNOWN`` on either side is skipped)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name, UNKNOWN)
            if mine is UNKNOWN or theirs is UNKNOWN:
                if theirs is UNKNOWN and f.name not in COVERED_BY and mine is not UNKNOWN:
                    return False  # a record from before this input existed: built from other inputs
                continue
            if mine != theirs:
                return False
        return True


def _jsonable(name: str, value: object) -> object:
    if name in ("toolkit", "env", "compiler"):
        return dict(cast(Pairs, value))  # these fields hold Pairs (their declared type, UNKNOWN excluded)
    if name == "patches":
        return [list(p) for p in cast(Pairs, value)]
    if isinstance(value, tuple):
        return list(value)
    return value


def _pairs(mapping: Mapping[str, str]) -> Pairs:
    return tuple(sorted(mapping.items()))


def toolkit_record(plan: Plan, toolkit: CudaToolkit | None) -> dict[str, str] | None:
    """The toolkit's part of the record and the cache key, with the flags this recipe's build gives nvcc."""
    return toolkit.record(ptxas_split=plan.recipe.ptxas_split) if toolkit is not None else None


def target_inputs(
    plan: Plan,
    *,
    source_digest: str | Unknown,
    toolkit: Mapping[str, str] | None | Unknown,
    python: PythonEnv | Unknown,
    compiler: Mapping[str, str] | None | Unknown = None,
) -> TargetInputs:
    """The inputs of ``plan`` once its parts are resolved: the source's digest, the toolkit's record (None for
    pure Python), the build venv and the host compiler (toolchain/hostcompiler.py; None for container builds)."""
    cuda_ext = plan.recipe.kind.is_cuda
    once = not cuda_ext  # a py3-none-any wheel is the same whatever torch, Python, index or CUDA built it
    return TargetInputs(
        builder=__version__,
        recipe=plan.recipe.content_digest(),
        patches=tuple((p.name, p.sha256()) for p in plan.patches),
        source=source_digest,
        toolkit=toolkit if isinstance(toolkit, Unknown) else
        _pairs({k: v for k, v in (toolkit or {}).items() if k in TOOLKIT_KEY_FIELDS}),
        python=BUILT_ONCE if once else python if isinstance(python, Unknown) else python.version,
        torch=BUILT_ONCE if once else python if isinstance(python, Unknown) else (python.torch or ""),
        index=BUILT_ONCE if once else plan.index.url,
        archs=tuple(str(a) for a in plan.target.archs) if cuda_ext else (),
        cuda=BUILT_ONCE if once else str(plan.cuda),
        env=_pairs(plan.env),
        compiler=compiler if compiler is None or isinstance(compiler, Unknown) else _pairs(compiler),
        platform=plan.recorded_platform,
    )


def recorded_inputs(record: BuildRecord) -> TargetInputs:
    """The inputs a build record (in a wheel, or records/*.json, also those written before this type) names.
    A field the record does not carry is UNKNOWN: the recipe's build env (its content digest covers it), and any input
    newer than the record (``agrees`` then says the record was built from other inputs)."""
    pure = not record.archs and str(record.toolchain.get("kind", "")).startswith("none")
    # built once (issue 28): an unlabelled pure-Python wheel's record carries its torch checks; one of the per-torch
    # pure wheels of before (no checks) keeps the inputs it was built from, so it is never taken for the new one
    once = pure and record.torch_checks is not None
    known: dict[str, Any] = {
        "builder": record.builder_version,
        "recipe": record.recipe.content_sha256 if record.recipe else "",
        "patches": tuple((p.file, p.sha256) for p in record.patches),
        "source": (record.source.sha256 if record.source else None) or "",
        "toolkit": () if pure else _pairs({k: v for k, v in record.toolchain.items() if k in TOOLKIT_KEY_FIELDS}),
        "python": BUILT_ONCE if once else str(record.build_python),
        "torch": BUILT_ONCE if once else str(record.python.get("torch") or ""),  # as written: the key's text
        "index": BUILT_ONCE if once else record.torch_index,
        "archs": record.archs,
        "cuda": BUILT_ONCE if once else record.cuda,
        "compiler": _pairs(record.host_compiler) if record.host_compiler else None,
        "platform": record.platform,
    }
    return TargetInputs(**{f.name: known.get(f.name, UNKNOWN) for f in fields(TargetInputs)})
