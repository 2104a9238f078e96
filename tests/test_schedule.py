"""The farm's start order (farm/schedule.py): longest first, by the real records of past builds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from builder.farm.schedule import UNKNOWN_CUDA_SECONDS, longest_first, past_builds
from builder.farm.spec import FarmTarget
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.model.recipe import RecipeKind
from builder.model.records import BuildRecord


def target(package: str, archs: str = "90", kind: str = "cuda-extension", toolchain: str = "host") -> FarmTarget:
    return FarmTarget(package=package, version="1.0", kind=RecipeKind(kind), cuda=CudaVersion.parse("13.0"),
                      archs=parse_arch_list(archs) if kind == "cuda-extension" else (), python=PythonSpec("3.11"),
                      torch="2.14.1", torch_index=None, toolchain=toolchain, recipes=Path("/recipes"), source=None,
                      jobs=None, entry="package[0]")


def publish_record(house: Path, wheel: str, **fields: object) -> None:
    """A record as the wheelhouse stores it (records/<wheel>.json, BuildRecord's one JSON form)."""
    (house / "records").mkdir(parents=True, exist_ok=True)
    record = BuildRecord(**fields)  # type: ignore[arg-type]
    (house / "records" / f"{wheel}.json").write_text(json.dumps(record.to_json()))


def test_targets_start_longest_first_by_their_past_builds(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    publish_record(house, "mamba_ssm-2.3.2-x.whl", package="mamba_ssm", version="2.3.2", cuda="13.0", archs=("90",),
                   toolchain={"kind": "host"}, timings={"python": 4.0, "build": 700.0, "test": 20.0})
    publish_record(house, "causal_conv1d-1.7.0-x.whl", package="causal-conv1d", version="1.7.0", cuda="13.0",
                   archs=("90", "120"), toolchain={"kind": "host"}, timings={"build": 400.0})
    publish_record(house / "staging", "tinyext-0.1.0-x.whl", package="tinyext", version="0.1.0", cuda="13.0",
                   archs=("90",), toolchain={"kind": "host"}, timings={"build": 50.0})
    publish_record(house, "pure-1.0-x.whl", package="pure", version="1.0", timings={"build": 2.0},
                   toolchain={"kind": "none (pure Python)"})
    (house / "records" / "broken.whl.json").write_text("{not json")  # skipped: the order is only a hint
    past = past_builds([house, house / "staging"])
    assert len(past) == 4

    todo = [target("pure", kind="pure-python"), target("tinyext"), target("causal-conv1d", "120"),
            target("mamba-ssm"), target("newpkg", "90,120"), target("tinyext", "90,120")]
    order = longest_first(todo, past)
    assert [(e.target.package, format(e.seconds, ".0f"), e.basis) for e in order] == [
        ("newpkg", f"{2 * UNKNOWN_CUDA_SECONDS:.0f}", "no past build"),  # never built: assumed long
        ("mamba-ssm", "724", "past build"),  # every stage of its last build
        ("causal-conv1d", "200", "past build of the package"),  # 400 s for two archs, this one has one
        ("tinyext", "100", "past build of the package"),  # the two-arch cell: the one-arch build scaled
        ("tinyext", "50", "past build"),  # from the staging area's record
        ("pure", "2", "past build"),
    ]
    # another toolchain's build of the same cell is not "the same": a docker build is timed apart
    docker = longest_first([target("mamba-ssm", toolchain="docker")], past)[0]
    assert docker.basis == "past build of the package"
    # ties keep the file's order
    a, b = target("x1"), target("x2")
    assert [e.target for e in longest_first([a, b], [])] == [a, b]
    assert [e.target for e in longest_first([b, a], [])] == [b, a]
    assert replace(a, package="x3") not in [e.target for e in longest_first([a], [])]


def test_a_past_build_for_another_platform_is_not_the_same_build(tmp_path: Path) -> None:
    """A cross build of aarch64 code takes its own time: an x86_64 record is only "of the package" for it."""
    from builder.model.platform import AARCH64

    house = tmp_path / "wheelhouse"
    publish_record(house, "demo-1.0-x86.whl", package="demo", version="1.0", cuda="13.0", archs=("90",),
                   toolchain={"kind": "host"}, timings={"build": 100.0})
    publish_record(house, "demo-1.0-arm.whl", package="demo", version="1.0", cuda="13.0", archs=("90", "121"),
                   toolchain={"kind": "host"}, timings={"build": 600.0}, platform="aarch64")
    past = past_builds([house])
    assert {b.platform for b in past} == {"x86_64", "aarch64"}
    arm = replace(target("demo"), platforms=(AARCH64,))
    x86 = target("demo")
    (arm_estimate,) = longest_first([arm], past)
    assert (arm_estimate.seconds, arm_estimate.basis) == (300.0, "past build of the package")  # 600 s / 2 archs
    (x86_estimate,) = longest_first([x86], past)
    assert (x86_estimate.seconds, x86_estimate.basis) == (100.0, "past build")
