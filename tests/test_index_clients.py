"""Real clients against the wheelhouse: pip and uv install over file:// and over `builder serve` on 127.0.0.1.

The wheels are tiny pure-Python ones labelled like real builds (``alpha-1.0+cu130torch2.14-py3-none-any.whl``,
pinning ``torch==``); installs use ``--no-deps`` so no torch is needed. The sidecar proof resolves a package with a
dependency through the served index and reads the server's access log: uv fetched ``X.whl.metadata`` and never
``X.whl``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.helpers import ROOT
from tests.test_index import labelled_wheel, raw_wheel

LABELS = ("cu130torch2.14", "cu128torch2.10")
TORCH = {"cu130torch2.14": "torch==2.14.1", "cu128torch2.10": "torch==2.10.0"}


@dataclass
class Index:
    house: Wheelhouse
    url: str  # http://127.0.0.1:PORT/
    access_log: Path
    tmp: Path

    def requested(self) -> list[str]:
        """Paths the server was asked for (GET/HEAD), unquoted, oldest first."""
        lines = self.access_log.read_text().splitlines()
        return [urllib.parse.unquote(m.group(2)) for line in lines if (m := re.search(r'"(GET|HEAD) (\S+) HTTP', line))]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    tmp = tmp_path_factory.mktemp("clients")
    house = Wheelhouse(tmp / "wh")
    for label in LABELS:  # the same version for two CUDA+torch combinations, each pinning its torch
        house.publish(labelled_wheel(tmp, "alpha", "1.0", label, requires=("beta>=2",), pins=(TORCH[label],)), BuildRecord.from_json({}))
    # gamma pins torch as a build does (torch>=2.14.0,<2.15: only CUDA 13 torches on PyPI, so the combined index
    # lists it); a stand-in torch, unlabelled, stands for PyPI's
    house.publish(labelled_wheel(tmp, "gamma", "1.0", "cu130torch2.14", requires=("beta>=2",)), BuildRecord.from_json({}))
    house.publish(raw_wheel(tmp / "beta", "beta", "2.0"), BuildRecord.from_json({}))
    house.publish(raw_wheel(tmp / "torch", "torch", "2.14.1"), BuildRecord.from_json({}))
    access_log = tmp / "access.log"
    with access_log.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house.root), "--port", "0"],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "300"},
        )
    try:
        line = proc.stdout.readline()
        assert " at http://127.0.0.1:" in line, line
        yield Index(house, line.split(" at ", 1)[1].split(" ", 1)[0], access_log, tmp)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _clean_env(tmp: Path) -> dict[str, str]:
    """No pip.conf, no PIP_*/UV_* settings of this machine: only the index the test names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_PROGRESS="1",
               UV_CACHE_DIR=str(tmp / "uv-cache"))
    return env


def pip_install(index_url: str, spec: str, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target),
         "--index-url", index_url, spec],
        capture_output=True, text=True, env=_clean_env(target.parent), cwd=target.parent, timeout=120,
    )


def uv_pip(args: list[str], workdir: Path) -> subprocess.CompletedProcess:
    """``uv pip ARGS`` with a fresh cache in ``workdir``, so every page and file it needs is fetched."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([uv_bin(), "pip", *args, "--no-config", "--python", sys.executable], capture_output=True,
                          text=True, env=_clean_env(workdir), cwd=workdir, timeout=120)


def uv_install(index_url: str, spec: str, target: Path) -> subprocess.CompletedProcess:
    return uv_pip(["install", "--no-deps", "--target", str(target), "--index-url", index_url, spec], target.parent)


def installed(target: Path) -> list[str]:
    return sorted(p.name.removesuffix(".dist-info") for p in target.glob("*.dist-info"))


CASES = [  # (which index, requirement) → the wheel that must be installed
    ("channels/cu130torch2.14/simple", "alpha==1.0", "alpha-1.0+cu130torch2.14"),
    ("channels/cu128torch2.10/simple", "alpha==1.0", "alpha-1.0+cu128torch2.10"),
    ("channels/cu128torch2.10/simple", "alpha", "alpha-1.0+cu128torch2.10"),
    ("simple", "alpha==1.0+cu128torch2.10", "alpha-1.0+cu128torch2.10"),
    ("simple", "beta", "beta-2.0"),
]


@pytest.mark.parametrize("client", ["pip", "uv"])
@pytest.mark.parametrize("transport", ["file", "http"])
def test_real_clients_install_from_the_index(index: Index, client: str, transport: str) -> None:
    base = index.house.root.resolve().as_uri() + "/" if transport == "file" else index.url
    for n, (where, spec, expected) in enumerate(CASES):
        target = index.tmp / f"{client}-{transport}-{n}" / "site"
        target.parent.mkdir(parents=True)
        result = (pip_install if client == "pip" else uv_install)(base + where, spec, target)
        assert result.returncode == 0, f"{client} {base + where} {spec}: {result.stderr[-2000:]}"
        assert installed(target) == [expected], f"{client} from {where}: {result.stdout}{result.stderr}"
        version = (target / expected.split("-")[0] / "__init__.py").read_text()
        public = expected.split("-")[1].split("+")[0]  # the wheel's version without its label: what it was built as
        assert version == f"VERSION = {public!r}\n", f"{client} from {where}: {version!r}"
    if transport == "http":
        assert any(p.startswith("/channels/cu128torch2.10/simple/alpha/") for p in index.requested())


def test_uv_resolves_through_metadata_sidecars_without_downloading_wheels(index: Index) -> None:
    wheels = ("gamma-1.0+cu130torch2.14-py3-none-any.whl", "beta-2.0-py3-none-any.whl", "torch-2.14.1-py3-none-any.whl")
    start = len(index.requested())
    work = index.tmp / "compile"
    work.mkdir()
    (work / "requirements.in").write_text("gamma==1.0\n")
    result = uv_pip(["compile", "requirements.in", "--index-url", index.url + "simple", "--no-header"], work)
    assert result.returncode == 0, result.stderr
    pins = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert pins == ["beta==2.0", "gamma==1.0+cu130torch2.14", "torch==2.14.1"], result.stdout
    compiled = index.requested()[start:]
    assert compiled[:2] == ["/simple/gamma/", f"/wheels/{wheels[0]}.metadata"], compiled
    assert sorted(compiled[2:]) == sorted(["/simple/beta/", f"/wheels/{wheels[1]}.metadata", "/simple/torch/",
                                           f"/wheels/{wheels[2]}.metadata"]), compiled

    # An install plan through a channel (searched first, as an extra index) with the combined index behind it.
    start = len(index.requested())
    work = index.tmp / "dry-run"
    result = uv_pip(["install", "--dry-run", "--target", str(work / "site"), "--index-url", index.url + "simple",
                     "--extra-index-url", index.url + "channels/cu130torch2.14/simple", "gamma"], work)
    assert result.returncode == 0, result.stderr
    assert "+ gamma==1.0+cu130torch2.14" in result.stderr and "+ beta==2.0" in result.stderr, result.stderr
    planned = index.requested()[start:]
    assert planned[0] == "/channels/cu130torch2.14/simple/gamma/", "uv asks the extra index first"
    assert "/channels/cu130torch2.14/simple/beta/" in planned, "beta has no label: not in the channel, 404"
    for name in wheels:
        assert f"/wheels/{name}.metadata" in planned, planned
    assert not [p for p in compiled + planned if p.endswith(".whl")], "uv downloaded a wheel"
    print("\nuv pip compile requested:", *compiled, sep="\n  ")
    print("uv pip install --dry-run requested:", *planned, sep="\n  ")


def test_uv_project_with_explicit_channel_index(index: Index) -> None:
    """docs/USING.md's pyproject snippet: an explicit channel index, used only for the packages pinned to it."""
    project = index.tmp / "app"
    project.mkdir()
    channel = index.url + "channels/cu130torch2.14/simple"
    (project / "pyproject.toml").write_text(f"""\
[project]
name = "app"
version = "0.1.0"
requires-python = ">=3.9"
dependencies = ["gamma==1.0"]

[[tool.uv.index]]
name = "cuda-wheels"
url = "{channel}"
explicit = true

[[tool.uv.index]]  # stands in for PyPI, which this test must not reach
name = "rest"
url = "{index.url}simple"
default = true

[tool.uv.sources]
gamma = {{ index = "cuda-wheels" }}
""")
    env = _clean_env(project)
    result = subprocess.run([uv_bin(), "lock", "--python", sys.executable], capture_output=True, text=True,
                            env=env, cwd=project, timeout=120)
    assert result.returncode == 0, result.stderr
    packages = {p["name"]: p for p in tomllib.loads((project / "uv.lock").read_text())["package"]}
    assert packages["gamma"]["version"] == "1.0+cu130torch2.14"
    assert packages["gamma"]["source"] == {"registry": channel}
    assert packages["gamma"]["wheels"][0]["url"].endswith("/wheels/gamma-1.0+cu130torch2.14-py3-none-any.whl")
    assert packages["beta"]["source"] == {"registry": index.url + "simple"}


def test_uv_takes_the_first_index_that_has_a_package_and_pip_merges(index: Index) -> None:
    """The measured fact docs/USING.md states: uv asks --extra-index-url first and stops at the first index that has
    the package; pip merges every index and takes the highest version (+cu130torch2.14 sorts above +cu128torch2.10)."""
    channel = index.url + "channels/cu128torch2.10/simple"
    flags = ["--index-url", index.url + "simple", "--extra-index-url", channel]
    work = index.tmp / "order-uv"
    result = uv_pip(["install", "--dry-run", "--no-deps", "--target", str(work / "site"), *flags, "alpha"], work)
    assert result.returncode == 0 and "+ alpha==1.0+cu128torch2.10" in result.stderr, result.stderr
    target = index.tmp / "order-pip" / "site"
    target.parent.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target), *flags,
         "alpha"], capture_output=True, text=True, env=_clean_env(target.parent), cwd=target.parent, timeout=120)
    assert result.returncode == 0, result.stderr
    assert installed(target) == ["alpha-1.0+cu130torch2.14"]
