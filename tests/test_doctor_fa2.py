"""Doctor on transformers' ``attn_implementation="flash_attention_2"``: would it load the env's flash-attn, and every
reason why not. The real transformers of the test venv judges stand-in ``flash_attn`` packages (real files, real
.dist-info metadata) put on PYTHONPATH: no GPU build of flash-attn can run here (the real check runs on the GPU
machine: docs/GPU-RESULTS.md, scripts/transformers-fa2-check.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder.cli.user import fa2_text
from builder.user.envprobe import FlashAttention2, probe_env
from tests.test_envprobe import make_dist, with_path

PY = Path(sys.executable)


def flash_attn_standin(site: Path, version: str, extension: str) -> None:
    make_dist(site, "flash-attn", version, {
        "flash_attn/__init__.py": f"__version__ = {version.split('+')[0]!r}\n",
        "flash_attn_2_cuda.py": extension,
    }, requires=("torch==2.13.0", "einops"))


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> FlashAttention2:
    site = tmp_path_factory.mktemp("site")
    flash_attn_standin(site, "2.8.3.post2+cu13torch2.13", "built_head_dims = (128,)\n")
    fa = probe_env(PY, env=with_path(site)).transformers.flash_attention_2
    assert fa is not None
    return fa


def test_no_flash_attn_is_the_one_reason() -> None:
    fa = probe_env(PY).transformers.flash_attention_2
    assert fa is not None and not fa.loads
    assert fa.reasons == ("flash-attn is not installed",) and fa.version is None


def test_a_cpu_torch_is_named_and_the_subset_head_dims_read(subset: FlashAttention2) -> None:
    """transformers itself says no without CUDA; the doctor names why (the test venv's torch is a CPU build) and
    still reads what the extension carries."""
    assert subset.version == "2.8.3.post2+cu13torch2.13" and subset.transformers_says is False
    assert not subset.loads
    assert any("is a CPU build" in r for r in subset.reasons), subset.reasons
    assert subset.built_head_dims == (128,)


def test_every_reason_is_listed(tmp_path: Path) -> None:
    """An old flash-attn whose extension does not import: both reasons, the import error's own text."""
    flash_attn_standin(tmp_path, "2.3.0", "raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    fa = probe_env(PY, env=with_path(tmp_path)).transformers.flash_attention_2
    assert fa is not None and not fa.loads
    text = fa2_text(fa)
    assert "2.3.0 is older than 2.3.3" in text
    assert "flash_attn_2_cuda fails to import: ImportError: libcudart.so.12" in text


def test_a_loading_subset_build_says_which_head_dims() -> None:
    fa = FlashAttention2(loads=True, reasons=(), version="2.8.3.post2+cu13torch2.11", transformers_says=True,
                         kernels_fallback=True, built_head_dims=(128,))
    assert fa2_text(fa) == ("loads flash-attn 2.8.3.post2+cu13torch2.11; head dims 128 only (a subset build: "
                            "other head dims are refused at the call)")
    full = FlashAttention2(True, (), "2.8.3.post2", True, None, (32, 64, 96, 128, 192, 256))
    assert fa2_text(full) == "loads flash-attn 2.8.3.post2"
