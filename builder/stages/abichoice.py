"""The ABI a build is made for (``choose_abi``): per-torch, or torch-stable where the recipe's stable-ABI port covers
the version and the Python and torch reach its floors; with why, and the cure where ``--abi torch-stable`` cannot
be. Also what ``--python PATH`` says about itself for that choice (``GivenInterpreter``), the torch a build uses
when none is given (``default_build_torch``), and the Python floor of a ``[per-torch-abi3]`` wheel."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder.core.errors import ToolchainError, UsageError
from builder.discovery.compat import TorchIndex, default_torch
from builder.model.abi import Abi, AbiChoice
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.model.recipe import Recipe
from builder.toolchain.local import interpreter_facts


@dataclass(frozen=True)
class GivenInterpreter:
    """What ``--python PATH`` said about itself when the plan asked it (its torch decides ``--abi auto``); the
    build asks it again (stages/pyenv.py) and stops there if it has no torch."""

    path: Path
    version: str | None  # 3.12; None: it could not be asked (``error`` says why)
    torch: str | None  # 2.11.0+cu130; None: no torch importable there
    torch_cuda: str | None
    error: str = ""


def check_python_agnostic(recipe: Recipe, version: str, abi: Abi, python: str | None) -> None:
    """A per-torch build of a release the recipe's ``[per-torch-abi3]`` covers makes a ``cp310-abi3`` wheel: refused
    with a Python below that floor, whose wheel no installer would give that Python."""
    agnostic = recipe.python_agnostic(version) if abi is Abi.PER_TORCH else None
    if agnostic is not None and python is not None and Version(python) < Version(agnostic.python_floor):
        raise UsageError(f"{recipe.name} {version}: its per-torch wheel is one {agnostic.tag} wheel for every Python "
                         f"from {agnostic.python_floor} ([per-torch-abi3] in {recipe.file}), so it cannot be built "
                         f"with or for Python {python}",
                         f"use --python {agnostic.python_floor} or newer: the one wheel serves Python {python}'s "
                         f"successors too")


def port_applies(asked: str, recipe: Recipe, version: str) -> bool:
    """Whether the recipe's stable-ABI port may decide this build (``asked``: ``--abi``), so that ``--python PATH``
    is worth asking."""
    stable = recipe.stable_abi
    return (recipe.kind.is_cuda and asked != Abi.PER_TORCH and stable is not None
            and stable.covers(version))


def ask_interpreter(python: PythonSpec) -> GivenInterpreter:
    """``--python PATH``'s Python and torch (its torch is imported: a few seconds), for the ABI choice; an
    interpreter that does not answer is noted, not raised: the build's own probe says so with its cure."""
    path = Path(shutil.which(python.text) or python.text)
    try:
        facts = interpreter_facts(path, with_torch=True)
    except ToolchainError as e:
        return GivenInterpreter(path, None, None, None, error=e.message)
    return GivenInterpreter(path, facts.get("version"), facts.get("torch"), facts.get("torch_cuda"),
                            error=str(facts.get("torch_error") or "") if not facts.get("torch") else "")


def choose_abi(asked_abi: str, spec: PythonSpec, recipe: Recipe, version: str, *, python: str | None,
               torch: str | None, given: GivenInterpreter | None = None) -> AbiChoice:
    """The build's ABI and why. ``--abi auto``: torch-stable where the recipe's ``[stable-abi]`` covers this
    version, the Python (``python``: the version given, or the one ``--python PATH`` runs) is at or above the abi3
    wheel's and the torch (``torch``: the build torch once known, or the one in ``--python PATH``) at or above the
    port's floor; else per-torch, saying which of those failed. ``--abi torch-stable`` where it cannot be is
    refused with that reason. ``asked_abi`` is ``--abi``, ``spec`` the ``--python`` given (a version or a path)."""
    if not recipe.kind.is_cuda:
        return AbiChoice(Abi.PER_TORCH, "pure Python: no torch ABI (one py3-none-any wheel)")
    if asked_abi == Abi.PER_TORCH:
        return AbiChoice(Abi.PER_TORCH, "per-torch, as --abi per-torch asks")
    asked = "--abi torch-stable" if asked_abi == Abi.TORCH_STABLE else "--abi auto"
    where = f" (in --python {spec})" if spec.is_path else ""
    why_not = _why_not_stable(spec, recipe, version, python, torch, where, given)
    if why_not is None:
        stable = recipe.stable_abi
        assert stable is not None
        on = f"torch {torch}{where} is at or above its floor {stable.floor_text}" if torch else \
            f"its floor {stable.floor_text} is checked against the build torch"
        return AbiChoice(Abi.TORCH_STABLE, f"torch-stable ({asked}): {recipe.name} {version} is covered by its "
                                           f"stable-ABI port ({stable.versions}), {on}, Python {python}{where} at "
                                           f"or above the abi3 wheel's {stable.python_floor}")
    if asked_abi == Abi.TORCH_STABLE:
        raise UsageError(f"--abi torch-stable: {recipe.name} {version} cannot be built against the stable ABI: "
                         f"{why_not}", _stable_cure(why_not))
    return AbiChoice(Abi.PER_TORCH, f"per-torch ({asked}): {why_not}")


def _why_not_stable(spec: PythonSpec, recipe: Recipe, version: str, python: str | None, torch: str | None,
                    where: str, given: GivenInterpreter | None) -> str | None:
    stable = recipe.stable_abi
    if stable is None:
        return "it has no stable-ABI port ([stable-abi] in its recipe)"
    if not stable.covers(version):
        return f"its stable-ABI port covers {stable.versions}"
    if python is None:
        told = given.error if given is not None else "not asked"
        return f"--python {spec} could not be asked for its Python and torch ({told})"
    if Version(python) < Version(stable.python_floor):
        return f"Python {python}{where} is below the abi3 wheel's {stable.python_floor}"
    if spec.is_path and torch is None:
        return f"no torch is importable{where} ({given.error if given is not None else 'not asked'})"
    if torch is not None and not stable.admits(torch):
        return f"torch {torch}{where} is below the port's floor {stable.floor_text}"
    return None


def _stable_cure(why_not: str) -> str:
    if "below the port's floor" in why_not:
        return "use a torch at or above the floor (--torch, or a --python whose torch is), or leave --abi out " \
               "(a per-torch build)"
    if "Python" in why_not and "below" in why_not:
        return "use a Python at or above the abi3 wheel's (--python), or leave --abi out (a per-torch build)"
    if "could not be asked" in why_not or "no torch" in why_not:
        return "give an interpreter that runs here and imports torch (--python PATH), or a Python version"
    return "leave --abi out (a per-torch build) or pick a version the port covers"


def default_build_torch(index: TorchIndex, cuda: CudaVersion, recipe: Recipe, abi: Abi) -> str:
    """The torch a build uses when ``--torch`` is not given: the newest for the CUDA; for a stable-ABI build the
    newest release of the floor's minor (the torch the port targets), else the oldest above it."""
    stable = recipe.stable_abi
    if abi is not Abi.TORCH_STABLE or stable is None:
        return default_torch(index, cuda)
    candidates = [t for t in index.torch_for(cuda) if stable.admits(t)]
    if not candidates:
        return default_torch(index, cuda)  # check_abi_torch says why it cannot be stable
    oldest_minor = min(Version(t).release[:2] for t in candidates)
    return max((t for t in candidates if Version(t).release[:2] == oldest_minor), key=Version)
