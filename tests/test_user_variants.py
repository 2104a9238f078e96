"""The user side of wheel variants (issue 29): the reader judges a plain wheel and notes its variants (never a
variant on its own), the uv line carries the preview flag where a wheel has variants (pip's never), and the
sentence `builder install` prints says which file uv installed and why."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from builder.model import variants
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.user import installer
from builder.user.fit import EnvFacts, IndexedWheel
from builder.user.wheelhouse import WheelhouseReader

PLAIN = "demo-1.0+cu130torch2.14-cp312-cp312-linux_x86_64.whl"


def _wheel(variant_labels: tuple[str, ...] = ()) -> IndexedWheel:
    return IndexedWheel(filename=PLAIN, project="demo", version=Version("1.0+cu130torch2.14"),
                        label="cu130torch2.14", url=f"file:///w/{PLAIN}", wheelhouse="file:///w/",
                        requires_python=None, requires=(), sass=("sm_120", "sm_90"), ptx=(), kernel_tests="passed",
                        variants=variant_labels)


ENV = EnvFacts(python="3.12.1", tags=frozenset({"cp312-cp312-linux_x86_64"}), torch="2.14.1", torch_cuda="13.0")


def test_the_reader_lists_plain_wheels_with_their_variant_labels(tmp_path: Path) -> None:
    page = tmp_path / "simple" / "demo"
    page.mkdir(parents=True)
    files = [PLAIN, PLAIN[:-4] + "-sm90.whl", PLAIN[:-4] + "-sm120.whl", "demo-1.0+cu130torch2.14-variants.json"]
    page.joinpath("index.json").write_text(json.dumps(
        {"meta": {"api-version": "1.1"}, "name": "demo",
         "files": [{"filename": f, "url": f, "hashes": {"sha256": "0" * 64}} for f in files]}))
    (wheel,) = WheelhouseReader(tmp_path).wheels("demo")
    assert wheel.filename == PLAIN and wheel.variants == ("sm120", "sm90")


def test_the_uv_line_carries_the_preview_flag_only_for_wheels_with_variants() -> None:
    python = Path("/env/bin/python")
    with_variants = installer.install_argv(python, [_wheel(("sm120", "sm90"))], ENV)
    assert with_variants[:5] == ["uv", "pip", "install", "--preview-features", variants.UV_PREVIEW_FEATURE]
    assert "--preview-features" not in installer.install_argv(python, [_wheel()], ENV)
    assert "--preview-features" not in installer.install_argv(python, [_wheel(("sm90",))], ENV, tool="pip")


def test_the_uv_this_tool_runs_knows_variants() -> None:
    assert installer.uv_knows_variants()


def _env_with(tmp_path: Path, variant: variants.Variant | None) -> Path:
    """A venv-like folder: an interpreter whose site-packages holds demo's dist-info (with a variant.json)."""
    site = tmp_path / "site"
    info = site / "demo-1.0+cu130torch2.14.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0+cu130torch2.14\n")
    if variant is not None:
        (info / "variant.json").write_bytes(variants.dumps(variants.metadata([variant])))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("arch", [90, 120])
def test_install_says_which_variant_uv_chose(tmp_path: Path, arch: int) -> None:
    chosen = variants.Variant.for_build(Arch(arch), CudaVersion.parse("13.0"))
    said = installer.variant_chosen(_env_with(tmp_path, chosen), _wheel(("sm120", "sm90")))
    assert said.startswith(f"the sm{arch} variant (sm_{arch} code only)") and "CUDA 13.0 or newer" in said


def test_install_says_when_uv_took_the_plain_wheel(tmp_path: Path) -> None:
    said = installer.variant_chosen(_env_with(tmp_path, None), _wheel(("sm120", "sm90")))
    assert said.startswith("the plain wheel (sm_120, sm_90)") and "none of its variants (sm120, sm90)" in said
