"""Issue 51 item 3: no index this tool publishes pairs a wheel with a torch of another CUDA major.

The mechanism (docs/INDEX.md "Which index for which torch"): a stable-ABI wheel of CUDA major M requires a torch no
older than the first release whose PyPI build is of major M (model/abi.py ``StableAbi.for_cuda_major``: ``+cu13``
says ``torch>=2.11``, PyPI's 2.10.0 being CUDA 12.8), and the combined ``simple/`` lists a CUDA-labelled wheel only
where every PyPI torch its requirement admits is of its major (index/channelpolicy.py ``root_lists``); the channels are
per CUDA line already. Both facts come from discovery's PyPI listing (the shipped snapshot), not a hand table.

The resolver test publishes, through the real ``Wheelhouse.publish``, tiny ``causal-conv1d`` wheels labelled and
pinned as the farm's are (``+cu13`` and ``+cu12`` stable, ``+cu12torch2.10``, ``+cu12torch2.11``,
``+cu13torch2.10``, ``+cu13torch2.14``) with records naming the torches they were checked on; each one's import
refuses a torch whose ``torch.version.cuda`` has another major. Stand-in torches (tiny wheels with the real versions
and ``torch.version.cuda``) sit in a stand-in PyPI (every PyPI release from 2.9.0 with its snapshot CUDA) and a
stand-in PyTorch channel (``+cu128``/``+cu130`` builds). For the combined index and every channel × every torch
(and no torch at all), real uv and real pip resolve ``causal-conv1d`` with that torch named exactly (as ``builder
install`` does), and every distinct pair either resolves is installed and imported. The table is printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.uvtool import uv_bin
from builder.core.wheelfile import write_wheel
from builder.discovery.compat import resolve_index
from builder.index.channelpolicy import pypi_torch, root_lists
from builder.index.mirror import pull
from builder.index.store import Wheelhouse
from builder.model.abi import cuda_line_major, first_torch_of_major, per_torch_requirement
from builder.model.cuda import CudaVersion
from builder.model.recipe import find_recipe, load_recipe
from builder.model.records import BuildRecord
from builder.stages.finalize import finalize_wheel
from builder.stages.plan import for_cuda_major
from tests.helpers import ROOT
from tests.test_index import raw_wheel

PYPI = resolve_index("pypi")  # the shipped snapshot: PyPI's torch releases and the CUDA each is built for
PYPI_TORCHES = {r.version: r.cuda or "" for r in (PYPI.listing.releases if PYPI.listing else ())
                if Version(r.version) >= Version("2.9.0")}
CHANNEL_TORCHES = {"2.10.0+cu130": "13.0", "2.11.0+cu128": "12.8", "2.14.1+cu130": "13.0", "2.15.0+cu130": "13.0"}
NONE = "(none)"  # the row where no torch is named: the resolver picks one


def stable_requirement(major: int) -> str:
    """What a build writes for causal-conv1d 1.7.0's stable wheel of ``major`` (the real recipe, the floor raised
    from the PyPI listing): ``torch>=2.11`` for 13, ``torch>=2.10`` for 12."""
    recipe = load_recipe(find_recipe("causal-conv1d", ROOT / "recipes"), ROOT / "patches")
    assert recipe.stable_abi is not None
    return recipe.stable_abi.for_cuda_major(first_torch_of_major(PYPI.torch_by_cuda, major)).requirement


def checks(*channels: str) -> list[dict[str, object]]:
    """Passed torch checks for channels named like ``cu130torch2.12`` (their CUDA line and torch minor)."""
    out: list[dict[str, object]] = []
    for channel in channels:
        flavour, minor = channel.split("torch")
        cuda = f"{flavour[2:-1]}.{flavour[-1]}"
        out.append({"torch": f"{minor}.0", "cuda": cuda, "channel": channel, "status": "passed",
                    "how": "import+registration"})
    return out


# label → (torch requirement, record): as the farm's builds write them
def farm_wheels() -> dict[str, tuple[str, dict[str, object]]]:
    stable = {"abi": "torch-stable"}
    return {
        "cu13": (stable_requirement(13), {**stable, "cuda": "13.0", "torch_floor": "2.11", "torch_checks": checks(
            "cu130torch2.11", "cu130torch2.12", "cu130torch2.13", "cu130torch2.14", "cu132torch2.15")}),
        "cu12": (stable_requirement(12), {**stable, "cuda": "12.8", "torch_floor": "2.10", "torch_checks": checks(
            "cu128torch2.10", "cu128torch2.11")}),
        "cu12torch2.10": (per_torch_requirement("2.10.0"), {"cuda": "12.8", "torch_checks": checks("cu128torch2.10")}),
        "cu12torch2.11": (per_torch_requirement("2.11.0"), {"cuda": "12.8", "torch_checks": checks("cu128torch2.11")}),
        "cu13torch2.10": (per_torch_requirement("2.10.0"), {"cuda": "13.0", "torch_checks": checks("cu130torch2.10")}),
        "cu13torch2.14": (per_torch_requirement("2.14.1"), {"cuda": "13.0", "torch_checks": checks("cu130torch2.14")}),
    }


def extension_wheel(tmp: Path, label: str, requirement: str) -> Path:
    """causal-conv1d 1.7.0 ``+label``: finalize writes its label and torch requirement; its import refuses a torch of
    another CUDA major, as the real port's does."""
    major = int(label[2:4])
    check = (f"import torch\n_MAJOR = {major}\n_have = torch.version.cuda\n"
             "if _have is None or int(_have.split('.')[0]) != _MAJOR:\n"
             "    raise ImportError(f'built for CUDA {_MAJOR}, but torch {torch.__version__} uses CUDA {_have}')\n")
    raw = raw_wheel(tmp / "raw" / label, "causal-conv1d", "1.7.0")
    with zipfile.ZipFile(raw) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    entries["causal_conv1d/__init__.py"] = check.encode()
    write_wheel(raw, entries, "causal_conv1d-1.7.0.dist-info", {})
    return finalize_wheel(raw, tmp / "final" / label, label=label, pins=[requirement],
                          build_record=BuildRecord(extra={"label": label}))


def torch_wheel(folder: Path, version: str, cuda: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    local = "" if "+" in version else f"+cu{cuda.replace('.', '')}"
    entries = {
        "torch/__init__.py": f"__version__ = {version + local!r}\nclass version:\n    cuda = {cuda!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\nstand-in\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    write_wheel(wheel, entries, info, {})
    return wheel


def simple_index(root: Path, torches: dict[str, str]) -> str:
    """A PEP 503 index of stand-in torches (PyPI's, or PyTorch's channel's): ``root/simple/torch/``."""
    files = root / "files"
    links = []
    for version, cuda in torches.items():
        wheel = torch_wheel(files, version, cuda)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{wheel.name.replace("+", "%2B")}#sha256={digest}">{wheel.name}</a><br/>')
    page = root / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "simple" / "index.html").write_text('<!DOCTYPE html><html><body><a href="torch/">torch</a></body></html>\n')
    return (root / "simple").as_uri() + "/"


@dataclass
class World:
    tmp: Path
    house: Wheelhouse
    pypi: str
    channel: str  # the stand-in PyTorch channel
    python: Path  # an empty venv: what the resolvers resolve for
    env: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("pairing")
    house = Wheelhouse(tmp / "wheelhouse")
    for label, (requirement, record) in farm_wheels().items():
        house.publish(extension_wheel(tmp / "built", label, requirement), BuildRecord.from_json(record))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "CONDA"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
               UV_CACHE_DIR=str(tmp / "uv-cache"), UV_NO_PROGRESS="1", NO_COLOR="1")
    subprocess.run([uv_bin(), "venv", "-q", "--no-config", "--python", sys.executable, str(tmp / "venv")], check=True,
                   env=env)
    return World(tmp, house, simple_index(tmp / "pypi", PYPI_TORCHES), simple_index(tmp / "pytorch", CHANNEL_TORCHES),
                 tmp / "venv" / "bin" / "python", env)


def indexes(house: Wheelhouse) -> list[tuple[str, Path]]:
    """The combined index and every channel the wheelhouse publishes."""
    return [("simple/", house.simple), *((f"channels/{c.name}/", c / "simple")
                                         for c in sorted(house.channels.iterdir()) if c.is_dir())]


def torch_index(world: World, torch: str) -> str:
    return world.channel if "+" in torch else world.pypi


def resolve(world: World, tool: str, index: Path, torch: str) -> dict[str, str] | str:
    """What ``tool`` would install for ``causal-conv1d`` from ``index`` (torch's own index as the default, ours as
    the extra one, as docs/USING.md says) with ``torch==X`` named; {name: version}, or the resolver's error line."""
    ours = index.as_uri() + "/"
    wanted = ["causal-conv1d", *([f"torch=={torch}"] if torch != NONE else [])]
    source = torch_index(world, torch)
    if tool == "uv":
        argv = [uv_bin(), "pip", "install", "--no-config", "--dry-run", "--python", str(world.python),
                "--index-url", source, "--extra-index-url", ours, *wanted]
        done = subprocess.run(argv, capture_output=True, text=True, env=world.env, timeout=120)
        if done.returncode:
            return _why(done.stderr)
        plan = [line.strip()[2:] for line in done.stderr.splitlines() if line.strip().startswith("+ ")]
        return dict(p.split("==", 1) for p in plan)
    argv = [sys.executable, "-m", "pip", "--python", str(world.python), "install", "--dry-run", "--quiet",
            "--report", "-", "--index-url", source, "--extra-index-url", ours, *wanted]
    done = subprocess.run(argv, capture_output=True, text=True, env=world.env, timeout=120)
    if done.returncode:
        return _why(done.stderr)
    report = json.loads(done.stdout)
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}


def _why(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    found = next((line for line in lines if "No solution" in line or "No matching distribution" in line
                  or "Could not find" in line or "ResolutionImpossible" in line), lines[0] if lines else "?")
    return f"refused ({found[:60]})"


def imports(world: World, pair: tuple[str, str]) -> str:
    """Install ``causal-conv1d==X`` and ``torch==Y`` (no resolving) into a folder of their own and import the
    extension with nothing else on the path: "ok", or the ImportError."""
    extension, torch = pair
    target = world.tmp / "pairs" / f"{extension}-{torch}"
    if not target.exists():
        wheels = [next((world.house.wheels).glob(f"causal_conv1d-{extension}-*.whl")),
                  next((world.tmp / ("pytorch" if "+" in torch else "pypi") / "files").glob(f"torch-{torch}-*.whl"))]
        subprocess.run([uv_bin(), "pip", "install", "--no-config", "--quiet", "--no-deps", "--python",
                        str(world.python), "--target", str(target), *map(str, wheels)], check=True, env=world.env)
    done = subprocess.run([str(world.python), "-S", "-c", "import causal_conv1d"], capture_output=True, text=True,
                          env={**world.env, "PYTHONPATH": str(target)}, timeout=60)
    return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def for_this_index(name: str, torch: str) -> bool:
    """Whether an index is the one docs/INDEX.md gives the users of ``torch``: the combined index for PyPI's torch
    builds (or none yet); a channel ``cuXYZtorchA.B`` for a torch of CUDA major X (its own line and torch minor
    first of all; another minor of the major is a wheel the resolver may refuse, never a mismatch). A torch from
    PyTorch's channel on the combined index, a torch of another major on a channel, or no torch on a channel (the
    resolver takes PyPI's newest) are not: PEP 440 cannot tell ``2.11.0`` from ``2.11.0+cu128``."""
    if name == "simple/":
        return "+" not in torch
    if torch == NONE:
        return False
    cuda = PYPI_TORCHES.get(torch) or CHANNEL_TORCHES.get(torch) or ""
    return cuda_line_major(cuda) == int(name.removeprefix("channels/cu")[:2])


def _pair(text: str) -> tuple[str, str]:
    extension, torch = text.removeprefix("causal-conv1d ").split(" + torch ")
    return extension, torch


def cells(world: World) -> Iterator[tuple[str, Path, str, str]]:
    for name, index in indexes(world.house):
        for torch in [NONE, *PYPI_TORCHES, *CHANNEL_TORCHES]:
            for tool in ("uv", "pip"):
                yield name, index, torch, tool


@pytest.mark.heavy
def test_no_index_pairs_a_wheel_with_a_torch_of_another_cuda_major(world: World) -> None:
    todo = list(cells(world))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: resolve(world, c[3], c[1], c[2]), todo))
    table: dict[tuple[str, str], dict[str, str]] = {}
    pairs: set[tuple[str, str]] = set()
    for (name, _, torch, tool), result in zip(todo, results, strict=True):
        if isinstance(result, str):
            table.setdefault((name, torch), {})[tool] = result
            continue
        extension, got = result.get("causal-conv1d"), result.get("torch")
        assert extension is not None and got is not None, (name, torch, tool, result)
        if torch != NONE:
            assert got == torch, f"{tool} from {name} moved torch {torch} to {got}"
        pairs.add((extension, got))
        table.setdefault((name, torch), {})[tool] = f"causal-conv1d {extension} + torch {got}"
    verdicts = {pair: imports(world, pair) for pair in sorted(pairs)}

    rows, bad, outside = [], [], []
    for (name, torch), by_tool in table.items():
        cuda = PYPI_TORCHES.get(torch) or CHANNEL_TORCHES.get(torch) or ""
        shown = {tool: text if text.startswith("refused") else f"{text} [{verdicts[_pair(text)]}]"
                 for tool, text in by_tool.items()}
        same = shown["uv"] == shown["pip"]
        mine = for_this_index(name, torch)
        row = (f"{name:26} {torch + (f' ({cuda})' if cuda else ''):22} "
               + (f"uv, pip: {shown['uv']}" if same else f"uv: {shown['uv']} | pip: {shown['pip']}")
               + ("" if mine else "   (not this index's torch)"))
        rows.append(row)
        broken = [t for t, text in shown.items() if not text.startswith("refused") and not text.endswith("[ok]")]
        if broken:
            (bad if mine else outside).append(row)
    print("\nindex × torch → what uv and pip install [its import]\n" + "\n".join(rows))
    print(f"\n{len(outside)} mismatched pairs where the torch is not the index's (PEP 440 cannot refuse them; "
          "docs/INDEX.md: the channel of the env's torch line)")
    assert not bad, "resolved pairs that fail to import:\n" + "\n".join(bad)
    # the reported case: the combined index, PyPI's torch 2.10.0 (CUDA 12.8): never the +cu13 wheel
    old = table[("simple/", "2.10.0")]
    assert all("+cu13" not in text for text in old.values()), old
    assert set(old.values()) == {"causal-conv1d 1.7.0+cu12torch2.10 + torch 2.10.0"}, old
    # and the channel of a CUDA 13 torch 2.10 (PyTorch's cu130) still serves it, with its per-torch wheel
    assert set(table[("channels/cu130torch2.10/", "2.10.0+cu130")].values()) == {
        "causal-conv1d 1.7.0+cu13torch2.10 + torch 2.10.0+cu130"}


def test_the_floor_per_cuda_major_comes_from_the_pypi_listing() -> None:
    """The +cu13 stable wheel's floor is PyPI's first CUDA 13 torch (2.11.0 in the snapshot); +cu12 keeps the
    recipe's 2.10; a major PyPI has no torch for keeps the recipe's (and the combined index leaves it out)."""
    assert first_torch_of_major(PYPI.torch_by_cuda, 13) == Version("2.11.0")
    assert PYPI.cuda_of("2.10.0") == "12.8" and cuda_line_major(PYPI.cuda_of("2.11.0") or "") == 13
    assert (stable_requirement(13), stable_requirement(12)) == ("torch>=2.11", "torch>=2.10")
    recipe = load_recipe(find_recipe("causal-conv1d", ROOT / "recipes"), ROOT / "patches")
    assert recipe.stable_abi is not None and recipe.stable_abi.for_cuda_major(None) is recipe.stable_abi
    # what the plan builds with (stages/plan.py): the requirement, TORCH_TARGET_VERSION and the record's floor
    cu13 = for_cuda_major(recipe, CudaVersion.parse("13.0")).stable_abi
    cu12 = for_cuda_major(recipe, CudaVersion.parse("12.8")).stable_abi
    assert cu13 is not None and cu12 is not None
    assert (cu13.floor_text, cu13.build_env(), cu12.floor_text) == ("2.11", {"BUILDER_TORCH_FLOOR": "2.11"}, "2.10")


@pytest.mark.parametrize(("filename", "requirement", "listed"), [
    ("c-1.7.0+cu13-cp310-abi3-linux_x86_64.whl", "torch>=2.11", True),
    ("c-1.7.0+cu13-cp310-abi3-linux_x86_64.whl", "torch>=2.10", False),  # the reported case: PyPI 2.10.0 is 12.8
    ("c-1.7.0+cu12-cp310-abi3-linux_x86_64.whl", "torch>=2.10", False),  # PyPI 2.11.0 on are CUDA 13
    ("c-1.7.0+cu12torch2.10-cp310-abi3-linux_x86_64.whl", "torch>=2.10.0,<2.11", True),
    ("c-1.7.0+cu12torch2.11-cp310-abi3-linux_x86_64.whl", "torch>=2.11.0,<2.12", False),
    ("c-1.7.0+cu13torch2.10-cp310-abi3-linux_x86_64.whl", "torch>=2.10.0,<2.11", False),
    ("c-1.6.2+cu130torch2.14-cp312-cp312-linux_x86_64.whl", "torch>=2.14.0,<2.15", True),
    ("c-1.6.2+cu130torch2.14-cp312-cp312-linux_x86_64.whl", None, False),  # no torch requirement: any torch
    ("c-1.6.2+cu130torch2.20-cp312-cp312-linux_x86_64.whl", "torch>=2.20.0,<2.21", False),  # PyPI has none yet
    ("fla_core-0.6.0-py3-none-any.whl", "torch>=2.7", True),  # bound to no CUDA
])
def test_root_lists_a_wheel_only_where_every_pypi_torch_it_admits_is_of_its_major(
        filename: str, requirement: str | None, listed: bool) -> None:
    metadata = "Metadata-Version: 2.1\nName: c\nVersion: 1\n" + (f"Requires-Dist: {requirement}\n" if requirement else "")
    assert root_lists(filename, None, metadata) is listed
    assert pypi_torch(), "the shipped snapshot lists PyPI's torch"


def test_a_channel_only_wheel_survives_a_pull(tmp_path: Path) -> None:
    """A wheel the combined index leaves out is in its channels only: `builder index pull` reads every channel
    (channels/index.json), so the nightly's pull → rebuild → export keeps it."""
    house = Wheelhouse(tmp_path / "published")
    requirement, record = farm_wheels()["cu12torch2.11"]
    wheel = extension_wheel(tmp_path / "built", "cu12torch2.11", requirement)
    house.publish(wheel, BuildRecord.from_json(record))
    assert not (house.simple / "causal-conv1d").exists()
    assert json.loads((house.channels / "index.json").read_text())["channels"] == [{"name": "cu128torch2.11"}]
    pulled = Wheelhouse(tmp_path / "pulled")
    result = pull(house.root.as_uri() + "/", pulled)
    assert result is not None
    assert [p.name for p in pulled.wheels.glob("*.whl")] == [wheel.name]
    assert (pulled.channels / "cu128torch2.11" / "simple" / "causal-conv1d" / "index.html").is_file()
