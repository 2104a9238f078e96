"""Doctor and the env probe on transformers' Mamba-2 mixers (Mamba2, Bamba, Falcon-H1, GraniteMoeHybrid, Nemotron-H,
Zamba2): which implementation each of their kernel functions is bound to after import, with the real transformers of
the test venv importing stand-in ``causal_conv1d`` / ``mamba_ssm`` packages (real files, real .dist-info metadata) put
on PYTHONPATH; no model is instantiated and nothing runs on a GPU.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from builder.user.envprobe import MAMBA2_ROLES, EnvReport, PackageSpec, probe_env
from tests.helpers import run_cli
from tests.test_envprobe import causal_conv1d_standin, make_dist, with_path

PY = Path(sys.executable)
HYBRIDS = {"mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2"}
MAMBA = "2.3.2.post1+cu130torch2.13"
SSD = ("def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,"
       " seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float('inf')), return_final_states=False,"
       " return_varlen_states=False):\n    return x\n"
       "def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,"
       " initial_states=None, seq_idx=None, dt_limit=(0.0, float('inf')), return_final_states=False,"
       " activation='silu', rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None,"
       " headdim=None, ngroups=1, norm_before_gate=True):\n    return zxbcdt\n")
SSU = ("def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,"
       " state_batch_indices=None):\n    return x\n")

pytestmark = [pytest.mark.drift,  # follows transformers: rerun against its newest release by scripts/drift-check.sh
              pytest.mark.skipif(Version(version("transformers")) < Version("5.15"),
                                 reason="transformers < 5.15 binds mamba_ssm only when CUDA is available")]


def mamba_ssm_standin(site: Path) -> None:
    """mamba_ssm's layout as transformers looks it up: mamba_ssm.ops.triton.{ssd_combined,selective_state_update}."""
    make_dist(site, "mamba-ssm", MAMBA, {
        "mamba_ssm/__init__.py": "", "mamba_ssm/ops/__init__.py": "", "mamba_ssm/ops/triton/__init__.py": "",
        "mamba_ssm/ops/triton/ssd_combined.py": SSD,
        "mamba_ssm/ops/triton/selective_state_update.py": SSU,
    }, requires=("torch==2.13.0",), record={"recipe": "mamba-ssm", "cuda": "13.0"})


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, EnvReport]:
    site = tmp_path_factory.mktemp("site")
    causal_conv1d_standin(site)
    mamba_ssm_standin(site)
    specs = [PackageSpec("causal-conv1d", ("causal_conv1d",)), PackageSpec("mamba-ssm", ("mamba_ssm",))]
    return site, probe_env(PY, specs, env=with_path(site))


def test_without_the_kernels_every_mixer_runs_the_torch_fallback() -> None:
    tf = probe_env(PY, []).transformers
    assert {m.short for m in tf.mamba2} == HYBRIDS and tf.missing_mamba2 == ()
    for model in tf.mamba2:
        assert model.family == "Mamba2" and model.error is None
        assert model.layer_class is not None and model.layer_class.endswith(("Mixer", "MambaLayer"))
        assert [f.role for f in model.functions] == list(MAMBA2_ROLES)
        for f in model.functions:
            assert f.kind == "torch fallback", (model.module, f)
            assert f.module == model.module and f.wrapper == "use_kernel_func_from_hub_with_fallback"
        assert model.function("selective_state_update").qualname == "mamba2_selective_state_update"
        assert model.fast_path is False
    assert all(m.family == "GatedDeltaNet" for m in tf.models)  # the GatedDeltaNet list is unchanged


def test_standin_kernels_are_what_every_mixer_binds(bound: tuple[Path, EnvReport]) -> None:
    site, report = bound
    assert report.package("mamba-ssm").imports_ok and report.package("causal-conv1d").imports_ok
    where = {"causal_conv1d_fn": ("causal-conv1d", "causal_conv1d.causal_conv1d_interface"),
             "causal_conv1d_update": ("causal-conv1d", "causal_conv1d.causal_conv1d_interface"),
             "selective_state_update": ("mamba-ssm", "mamba_ssm.ops.triton.selective_state_update"),
             "mamba_chunk_scan_combined": ("mamba-ssm", "mamba_ssm.ops.triton.ssd_combined"),
             "mamba_split_conv1d_scan_combined": ("mamba-ssm", "mamba_ssm.ops.triton.ssd_combined")}
    assert {m.short for m in report.transformers.mamba2} == HYBRIDS
    for model in report.transformers.mamba2:
        for f in model.functions:
            package, module = where[f.role]
            assert f.kind == "kernel", (model.module, f)
            assert (f.package, f.module, f.qualname) == (package, module, f.role)
            assert f.file == site / (module.replace(".", "/") + ".py")
            assert f.package_version == (MAMBA if package == "mamba-ssm" else "1.7.0+cu130torch2.13")
        assert model.fast_path is True
    for model in report.transformers.models:  # GatedDeltaNet: conv1d from the stand-in, the rule still torch
        assert model.function("causal_conv1d_fn").kind == "kernel"
        assert model.function("chunk_gated_delta_rule").kind == "torch fallback"


def test_doctor_lists_the_mixers_bound_to_our_kernels(bound: tuple[Path, EnvReport], tmp_path: Path) -> None:
    """What the issue's closing note shows on the H200, here with stand-ins: the doctor's table and advice."""
    site, _ = bound
    result = run_cli("doctor", "--python", sys.executable, "--from", str(tmp_path / "none"),
                     env={"PYTHONPATH": str(site)}, timeout=600)
    assert result.code == 0, result.stderr
    out = result.stdout
    assert "Mamba2: mamba2, bamba, falcon_h1, granitemoehybrid, nemotron_h, zamba2:" in out
    ssd = site / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py"
    assert (f"mamba_chunk_scan_combined          kernel (mamba-ssm {MAMBA}: mamba_ssm.ops.triton.ssd_combined."
            f"mamba_chunk_scan_combined from {ssd})") in out
    assert "selective_state_update             kernel (mamba-ssm" in out
    assert "Mamba-2 mixer functions" not in out  # no fallback advice for the mixers
    assert "GatedDeltaNet functions (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule); their kernels " \
           "come from fla-core" in " ".join(out.split())


def test_doctor_advice_names_the_missing_packages(tmp_path: Path) -> None:
    result = run_cli("doctor", "--python", sys.executable, "--from", str(tmp_path / "none"), timeout=600)
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert ("mamba2, bamba, falcon_h1, granitemoehybrid, nemotron_h, zamba2 run the torch fallback for 5 of 5 "
            "Mamba-2 mixer functions (causal_conv1d_fn, causal_conv1d_update, selective_state_update, "
            "mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined); their kernels come from causal-conv1d, "
            "mamba-ssm") in text
