"""CPU checks for fastpath_check.py: run it end to end with transformers' real Qwen3-Next code and CPU stand-ins
of the fla and causal-conv1d kernels (written to a temporary folder as packages `fla` and `causal_conv1d`), on
its development switch --device cpu; and without a GPU on the default device (skipped, exit 3).

Run: python -m pytest recipes/flash-linear-attention/test_fastpath_cpu.py   (needs torch and transformers with
Qwen3-Next; skipped otherwise). TRANSFORMERS_EXTRA_PATHS=/dir/tf-5.14[:...] (transformers installed with
`pip install --no-deps --target`) repeats the runs against those versions too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")
pytestmark = pytest.mark.drift  # follows transformers: rerun against its newest release by scripts/drift-check.sh
pytest.importorskip("transformers", reason="skipped: transformers is not installed in the test environment")
try:
    import transformers.models.qwen3_next  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("this transformers has no Qwen3-Next", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parent / "fastpath_check.py"

FAKE_FLA = '''
import os
import torch
import torch.nn.functional as F

FAULT = os.environ.get("FAKE_FLA_FAULT", "")


def _gdr(q, k, v, g, beta, scale, initial_state, output_final_state, l2norm):
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    hv, h = v.shape[2], q.shape[2]
    q, k = q.repeat_interleave(hv // h, 2), k.repeat_interleave(hv // h, 2)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    b, t, _, dk = q.shape
    state = initial_state.float() if initial_state is not None else q.new_zeros(b, hv, dk, v.shape[-1])
    outs = []
    for i in range(t):
        state = state * g[:, i].exp()[..., None, None]
        u = (v[:, i] - torch.einsum("bhk,bhkv->bhv", k[:, i], state)) * beta[:, i, :, None]
        state = state + k[:, i, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i], state))
    o = torch.stack(outs, 1)
    if FAULT == "scale":
        o = o * 1.5
    return o.to(dtype), (state if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    return _gdr(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    return _gdr(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)
'''

FAKE_FLA_MODULES = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class FusedRMSNormGated(nn.Module):
    def __init__(self, hidden_size, elementwise_affine=True, eps=1e-5, activation="swish", **kwargs):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (x * F.silu(g.float())).to(dtype)
'''

FAKE_CONV = '''
import torch
import torch.nn.functional as F


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    width = weight.shape[1]
    out = F.conv1d(F.pad(x.float(), (width - 1, 0)), weight.float().unsqueeze(1),
                   None if bias is None else bias.float(), groups=x.shape[1])
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return out.to(x.dtype)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    seqlen, state_len = x3.shape[-1], conv_state.shape[-1]
    full = torch.cat([conv_state, x3.to(conv_state.dtype)], dim=-1)
    conv_state.copy_(full[..., -state_len:])
    out = F.conv1d(full.float(), weight.float().unsqueeze(1), None if bias is None else bias.float(),
                   groups=x3.shape[1])[..., -seqlen:]
    if activation in ("silu", "swish"):
        out = F.silu(out)
    out = out.to(x.dtype)
    return out.squeeze(-1) if squeeze else out
'''


def _dist_info(root: Path, name: str, version: str, top: str) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(top + "\n")
    (info / "RECORD").write_text("")


def make_fakes(root: Path, fla: bool = True, conv: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if fla:
        pkg = root / "fla"
        (pkg / "ops" / "gated_delta_rule").mkdir(parents=True)
        (pkg / "modules").mkdir()
        (pkg / "__init__.py").write_text('__version__ = "0.6.0"\n')
        (pkg / "ops" / "__init__.py").write_text("")
        (pkg / "ops" / "gated_delta_rule" / "__init__.py").write_text(textwrap.dedent(FAKE_FLA))
        (pkg / "modules" / "__init__.py").write_text(textwrap.dedent(FAKE_FLA_MODULES))
        _dist_info(root, "fla-core", "0.6.0", "fla")
        _dist_info(root, "flash-linear-attention", "0.6.0", "fla")
    if conv:
        (root / "causal_conv1d").mkdir()
        (root / "causal_conv1d" / "__init__.py").write_text(textwrap.dedent(FAKE_CONV))
        _dist_info(root, "causal-conv1d", "1.7.0", "causal_conv1d")
    return root


def _transformers_paths() -> List[Optional[str]]:
    extra = [p for p in os.environ.get("TRANSFORMERS_EXTRA_PATHS", "").split(os.pathsep) if p]
    return [None, *extra]


def run_script(tmp: Path, fakes: Optional[Path], *args: str, env: Optional[Dict[str, str]] = None,
               tf_path: Optional[str] = None) -> tuple[int, Dict[str, Any], str]:
    out = tmp / "result.json"
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    paths = [p for p in (tf_path, str(fakes) if fakes else None) if p]
    if paths:
        run_env["PYTHONPATH"] = os.pathsep.join(paths)
    run_env.update(env or {})
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--seed", "7", *args], env=run_env,
                          capture_output=True, text=True, cwd=tmp, timeout=900)
    data = json.loads(out.read_text())
    return proc.returncode, data, proc.stdout + proc.stderr


def _status(data: Dict[str, Any]) -> Dict[str, str]:
    return {c["name"]: c["status"] for c in data["cases"]}


@pytest.mark.parametrize("tf_path", _transformers_paths())
def test_fast_path_with_both_packages_passes(tmp_path: Path, tf_path: Optional[str]) -> None:
    code, data, log = run_script(tmp_path, make_fakes(tmp_path / "fakes"), "--device", "cpu", "--quick",
                                 tf_path=tf_path)
    assert code == 0, log
    status = _status(data)
    for name in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        assert status[f"resolved/{name}"] == "passed" and status[f"ran/{name}"] == "passed", (name, log)
    assert status["fallback/no_kernel_calls"] == "passed"
    assert status["messages/no_fallback_warning"] == "passed"
    assert status["compare/prefill/logits"] == "passed"
    assert sum(n.startswith("compare/prefill/linear_attn_layer") for n in status) == 3
    assert sum(n.startswith("compare/decode_step") for n in status) == 2
    assert data["calls"]["fast"]["prefill"]["chunk_gated_delta_rule"] == 3
    assert data["calls"]["fast"]["decode"]["recurrent_gated_delta_rule"] == 3 * 2
    assert all(v == 0 for phase in data["calls"]["fallback"].values() for v in phase.values())


@pytest.mark.parametrize("tf_path", _transformers_paths())
def test_a_wrong_kernel_fails_the_comparison(tmp_path: Path, tf_path: Optional[str]) -> None:
    code, data, log = run_script(tmp_path, make_fakes(tmp_path / "fakes"), "--device", "cpu", "--quick",
                                 env={"FAKE_FLA_FAULT": "scale"}, tf_path=tf_path)
    assert code == 1, log
    status = _status(data)
    assert status["compare/prefill/linear_attn_layer0"] == "failed"
    assert status["ran/chunk_gated_delta_rule"] == "passed"  # it ran, it is just wrong


def test_without_causal_conv1d_its_cases_are_skipped(tmp_path: Path) -> None:
    code, data, log = run_script(tmp_path, make_fakes(tmp_path / "fakes", conv=False), "--device", "cpu", "--quick")
    status = _status(data)
    assert status["ran/causal_conv1d_fn"] == "skipped" and status["resolved/causal_conv1d_update"] == "skipped"
    assert status["ran/chunk_gated_delta_rule"] == "passed"
    assert status["messages/no_fallback_warning"] in ("skipped", "passed")
    assert code == 0, log


def test_without_fla_the_check_fails(tmp_path: Path) -> None:
    code, data, log = run_script(tmp_path, make_fakes(tmp_path / "fakes", fla=False), "--device", "cpu", "--quick")
    status = _status(data)
    assert code == 1, log
    assert status["ran/chunk_gated_delta_rule"] == "failed"


def test_skipped_without_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, data, _ = run_script(tmp_path, None)
    assert code == 3 and data["status"] == "skipped" and "no CUDA GPU" in data["reason"]
    assert data["counts"] == {"passed": 0, "failed": 0, "skipped": 0}
