"""The GitHub Actions matrix of a farm's targets (``github_matrix``: ``{"include": [...]}``, one job per target with
the runner that builds it natively), the GPU runners that kernel-test each wheel (``route``: one per arch a configured
runner has, or why none can), and the nightly's test jobs fanned out per (target, runner) (``tested_matrix``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.farm.spec import Farm, FarmTarget
from builder.model.arch import format_arch_list


@dataclass(frozen=True)
class Route:
    """Where a target's wheel is kernel-tested: the GPU runner of each arch it ships that a configured runner has
    (``tests``: (arch, label), newest first, one per label; ``runner``: the first), the archs no runner has
    (``untested_archs``), or, where no runner can test it at all, why (``untested``)."""

    runner: str | None
    untested: str | None = None  # "untested: no runner for aarch64 sm_121,110,103,100,90 (...)"
    tests: tuple[tuple[int, str], ...] = ()
    untested_archs: tuple[int, ...] = ()


def route(farm: Farm, target: FarmTarget) -> Route:
    """A CUDA target: a GPU runner of its platform for EACH arch its wheel carries that [runners] available has
    (farm/spec.py ``Farm.runners_per_arch``; an arch whose label an newer arch already took is tested in that job),
    the others listed untested. A pure-Python wheel, which ships no GPU code: one runner, of each platform it serves
    in order, for an arch of its first list (``Farm.runner_for``). None at all: "untested: no runner for ..."."""
    numbers = sorted({a.number for a in target.archs}, reverse=True)
    if target.kind.is_cuda:
        tests: dict[str, int] = {}
        missing: list[int] = []
        for number, label in farm.runners_per_arch(target.archs, target.platform):
            if label is None:
                missing.append(number)
            else:
                tests.setdefault(label, number)
        if tests:
            pairs = tuple((number, label) for label, number in tests.items())
            return Route(pairs[0][1], None, pairs, tuple(missing))
    else:
        for platform in target.platforms:
            label = farm.runner_for(target.archs, platform)
            if label is not None:
                arch = next((n for n in numbers if farm.runner_label(n, platform) == label), numbers[0] if numbers
                            else 0)
                return Route(label, None, ((arch, label),))
    platforms = "/".join(p.name for p in target.platforms)
    wanted = ", ".join(farm.runner_label(n, p) for p in target.platforms for n in numbers)
    return Route(None, f"untested: no runner for {platforms} sm_{','.join(map(str, numbers))} (none of {wanted} is "
                       "in [runners] available)", (), tuple(numbers) if target.kind.is_cuda else ())


def github_matrix(farm: Farm, targets: list[FarmTarget]) -> dict[str, list[dict[str, str]]]:
    """``{"include": [...]}`` for ``strategy.matrix``: one job per target, with the platform, the runner that builds
    it natively (``build_runner``: ubuntu-24.04, ubuntu-24.04-arm) and the GPU runner label by platform and arch
    (``runner``; "" with ``untested`` saying why when no configured runner can test it)."""
    base = farm.directory
    include = []
    for t in targets:
        where = route(farm, t)
        include.append({
            "id": t.id,
            "package": t.package,
            "version": t.version,
            "kind": str(t.kind),
            "platform": t.platform.name,
            "build_runner": t.platform.runner,
            "cuda": str(t.cuda),
            "arch": format_arch_list(t.archs),
            "python": str(t.python),
            "torch": t.torch,
            "torch_index": t.torch_index or "",
            "recipes": _relative(t.recipes, base),
            "source": _relative(Path(t.source), base) if t.source and "://" not in t.source
            and not t.source.startswith("git+") else (t.source or ""),
            "runner": where.runner or "",
            "untested": where.untested or "",
            # one GPU test job per (target, runner): the labels and the arch each tests, newest first (tested_matrix
            # and the nightly's jq fan them out); the archs no runner has, named in the plan's summary
            "runners": " ".join(label for _, label in where.tests),
            "test_archs": " ".join(str(number) for number, _ in where.tests),
            "untested_archs": _untested_archs(farm, t, where),
        })
        # the farm decided (a version with a port could go either way with auto): `builder build --abi` says so
        include[-1]["abi"] = str(t.abi) if t.port is not None else "auto"
        include[-1]["variants"] = "true" if t.variants else ""
    return {"include": include}


def _untested_archs(farm: Farm, target: FarmTarget, where: Route) -> str:
    """``sm_103,100 (no gpu-sm103-x86_64, gpu-sm100-x86_64 in [runners] available)`` for a target some of whose archs
    a runner tests; "" where every arch is tested or none is (``untested`` says that)."""
    if not where.tests or not where.untested_archs:
        return ""
    labels = ", ".join(farm.runner_label(n, target.platform) for n in where.untested_archs)
    return (f"{target.platform.name} sm_{','.join(map(str, where.untested_archs))} (no {labels} in [runners] "
            "available)")


def tested_matrix(matrix: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    """The nightly's GPU test jobs: one per (target, runner) of the GitHub matrix, for each arch of the target that a
    configured runner has (``runner``: that label, ``test_arch``, ``test_id``: ``<id>-sm<arch>``, unique per job for
    its artifact); the targets no runner has are reported untested. The plan's jq filter does the same."""
    include = []
    for row in matrix["include"]:
        if not row["runner"]:
            continue
        for label, arch in zip(row["runners"].split(" "), row["test_archs"].split(" "), strict=True):
            include.append({**row, "runner": label, "test_arch": arch, "test_id": f"{row['id']}-sm{arch}"})
    return {"include": include}


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)
