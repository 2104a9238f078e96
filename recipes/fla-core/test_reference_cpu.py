"""CPU checks for kernel_tests.py: its fp32 gated-delta-rule reference against an independent chunked
(WY / triangular-solve) formulation and against upstream's semantics, its case design, and the whole harness
against fake CPU "kernels", good and broken.

Run: python -m pytest recipes/fla-core/test_reference_cpu.py
The reference is also compared with upstream's own fla/ops/gated_delta_rule/naive.py of 0.4.2 and 0.6.0 (sdists
fetched from PyPI, or unpacked ones named in FLA_CORE_SRC; loaded by path; needs einops, not triton).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE.parent / "_harness"))
import kernel_harness as kh  # noqa: E402 (the shared harness beside the recipes)

kt = kh.load_suite(HERE / "kernel_tests.py", "fla_core_kernel_tests")
CPU = torch.device("cpu")


# --------------------------------------------------------------------------- independent formulations


def chunked_gdr(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                output_final_state: bool = False, use_qk_l2norm: bool = False,
                chunk: int = 16) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The gated delta rule computed chunk by chunk in the WY form (as fla's chunk kernels do), with the
    within-chunk system solved by torch.linalg.solve_triangular. fp32, differentiable. Value head j uses
    q/k head j // (HV // H), written here as an explicit index rather than repeat_interleave."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    head_of = torch.arange(hv) // (hv // h)
    q, k = q[:, :, head_of], k[:, :, head_of]
    scale = dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.transpose(1, 2) for x in (q, k, v, g, beta))  # [B, HV, T, ...]
    state = initial_state.float() if initial_state is not None else q.new_zeros(b, hv, dk, dv)
    outs = []
    for s in range(0, t, chunk):
        qc, kc, vc, gc, bc = (x[:, :, s:s + chunk] for x in (q, k, v, g, beta))
        n = qc.shape[2]
        gam = gc.cumsum(-1)  # cumulative log decay inside the chunk
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        diff = gam[..., :, None] - gam[..., None, :]
        decay = torch.where(lower, diff, torch.full_like(diff, -float("inf"))).exp()
        kb = kc * bc[..., None]
        strict = ((kb @ kc.transpose(-1, -2)) * decay).masked_fill(~lower | torch.eye(n, dtype=torch.bool), 0)
        eye = torch.eye(n).expand_as(strict)
        tmat = torch.linalg.solve_triangular(eye + strict, eye, upper=False)
        u = tmat @ (vc * bc[..., None])
        w = tmat @ (kb * gam.exp()[..., None])
        v_new = u - w @ state
        attn = (qc @ kc.transpose(-1, -2)) * decay
        outs.append(scale * ((qc * gam.exp()[..., None]) @ state + attn @ v_new))
        state = state * gam[..., -1, None, None].exp() + (kc * (gam[..., -1:] - gam).exp()[..., None]).transpose(
            -1, -2) @ v_new
    o = torch.cat(outs, dim=2).transpose(1, 2)
    return o, (state if output_final_state else None)


def upstream_naive_recurrent(q, k, v, beta, g, scale=None, initial_state=None, output_final_state=False):
    """fla's naive_recurrent_gated_delta_rule (fla/ops/gated_delta_rule/naive.py, 0.4.2-0.6.0), transcribed:
    the semantics our reference must follow (no grouped value heads there)."""
    q, k, v, beta, g = map(lambda x: x.transpose(1, 2).contiguous().to(torch.float32), [q, k, v, beta, g])
    B, H, T, K, V = *k.shape, v.shape[-1]
    o = torch.zeros(B, H, T, V).to(v)
    h = torch.zeros(B, H, K, V).to(v)
    if initial_state is not None:
        h = initial_state.to(torch.float32)
    if scale is None:
        scale = 1 / (q.shape[-1] ** 0.5)
    q = q * scale
    for i in range(T):
        b_q = q[:, :, i]
        b_k = k[:, :, i]
        b_v = v[:, :, i].clone()
        h = h.clone() * g[:, :, i].exp()[..., None, None]
        b_beta = beta[:, :, i]
        b_v = b_v - (h.clone() * b_k[..., None]).sum(-2)
        b_v = b_v * b_beta[..., None]
        h = h.clone() + b_k.unsqueeze(-1) * b_v.unsqueeze(-2)
        o[:, :, i] = torch.einsum('bhd,bhdm->bhm', b_q, h)
    if not output_final_state:
        h = None
    return o.transpose(1, 2).contiguous(), h


def _inputs(b: int = 2, t: int = 37, h: int = 2, hv: int = 4, d: int = 8, gate: str = "logsigmoid",
            seed: int = 0, dtype: torch.dtype = torch.float32) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=gen)
    k = F.normalize(torch.randn(b, t, h, d, generator=gen), dim=-1)
    g = F.logsigmoid(torch.rand(b, t, hv, generator=gen))
    if gate == "qwen":
        g = -torch.empty(hv).uniform_(0.01, 16, generator=gen) * F.softplus(torch.randn(b, t, hv, generator=gen) + 1)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": torch.randn(b, t, hv, d, generator=gen).to(dtype), "g": g,
            "beta": torch.rand(b, t, hv, generator=gen).sigmoid().to(dtype),
            "h0": torch.randn(b, hv, d, d, generator=gen)}


def _ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    return kt.kh.err_ratio(a, b)[0]


# --------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("gate", ["logsigmoid", "qwen"])
@pytest.mark.parametrize("hv", [2, 4])
@pytest.mark.parametrize("t", [1, 16, 37])
def test_reference_matches_chunked_formulation(gate: str, hv: int, t: int) -> None:
    x = _inputs(t=t, hv=hv, gate=gate)
    o, ht = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                    output_final_state=True)
    co, cht = chunked_gdr(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True)
    assert o.dtype == torch.float32 and o.shape == x["v"].shape and ht.shape == x["h0"].shape
    assert _ratio(co, o) < 1e-5 and _ratio(cht, ht) < 1e-5


def test_reference_matches_upstream_naive_semantics() -> None:
    x = _inputs(hv=2, h=2)
    for scale in (None, 0.3):
        o, ht = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale,
                                        initial_state=x["h0"], output_final_state=True)
        uo, uht = upstream_naive_recurrent(x["q"], x["k"], x["v"], x["beta"], x["g"], scale=scale,
                                           initial_state=x["h0"], output_final_state=True)
        torch.testing.assert_close(o, uo, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ht, uht, rtol=1e-5, atol=1e-5)


def test_grouped_value_heads_use_head_j_div_group() -> None:
    """Value head j reads q/k head j // (HV // H) (fla's i_h = i_hv // (HV // H)), checked head by head."""
    x = _inputs(h=2, hv=6)
    o, ht = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                    output_final_state=True)
    for j in range(6):
        i = j // 3
        oj, hj = upstream_naive_recurrent(x["q"][:, :, i:i + 1], x["k"][:, :, i:i + 1], x["v"][:, :, j:j + 1],
                                          x["beta"][:, :, j:j + 1], x["g"][:, :, j:j + 1],
                                          initial_state=x["h0"][:, j:j + 1], output_final_state=True)
        torch.testing.assert_close(o[:, :, j:j + 1], oj, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ht[:, j:j + 1], hj, rtol=1e-5, atol=1e-5)


def test_state_chaining_and_flags() -> None:
    """Running T1 then T2 tokens with the final state handed over equals running T1 + T2 at once; no final
    state unless asked; no initial state means zeros."""
    x = _inputs(t=30)
    full, h_full = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                           output_final_state=True)
    a = {n: (v[:, :11] if v.dim() > 2 and n != "h0" else v) for n, v in x.items()}
    b = {n: (v[:, 11:] if v.dim() > 2 and n != "h0" else v) for n, v in x.items()}
    o1, h1 = kt.ref_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=x["h0"],
                                     output_final_state=True)
    o2, h2 = kt.ref_gated_delta_rule(b["q"], b["k"], b["v"], b["g"], b["beta"], initial_state=h1,
                                     output_final_state=True)
    torch.testing.assert_close(torch.cat([o1, o2], 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h2, h_full, rtol=1e-5, atol=1e-5)
    _, none = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"])
    assert none is None
    zero = torch.zeros_like(x["h0"])
    o_zero, _ = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=zero)
    o_none, _ = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    torch.testing.assert_close(o_zero, o_none)


def test_l2norm_in_kernel_equals_prenormalised_inputs() -> None:
    x = _inputs()
    raw_q, raw_k = x["q"] * 3.0, torch.randn_like(x["k"]) * 5.0
    o1, _ = kt.ref_gated_delta_rule(raw_q, raw_k, x["v"], x["g"], x["beta"], use_qk_l2norm=True)
    nq = raw_q / torch.sqrt((raw_q ** 2).sum(-1, keepdim=True) + 1e-6)
    nk = raw_k / torch.sqrt((raw_k ** 2).sum(-1, keepdim=True) + 1e-6)
    o2, _ = kt.ref_gated_delta_rule(nq, nk, x["v"], x["g"], x["beta"])
    torch.testing.assert_close(o1, o2, rtol=1e-6, atol=1e-6)


def _grads(fn, x: Dict[str, torch.Tensor], **kwargs) -> Dict[str, torch.Tensor]:
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], initial_state=leaves["h0"],
               output_final_state=True, **kwargs)
    gen = torch.Generator().manual_seed(1)
    torch.autograd.backward([o, ht], [torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)])
    return {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("l2norm", [False, True])
def test_reference_gradients_match_chunked_formulation_and_segmenting(l2norm: bool) -> None:
    """Backward through the segmented (checkpointed) reference equals backward through the unsegmented one and
    through the chunked WY formulation: q, k, v, g, beta and h0, with grouped value heads."""
    x = _inputs(t=45, h=2, hv=4)
    seg = _grads(kt.ref_gated_delta_rule, x, use_qk_l2norm=l2norm, segment=8)
    whole = _grads(kt.ref_gated_delta_rule, x, use_qk_l2norm=l2norm, segment=10_000)
    wy = _grads(chunked_gdr, x, use_qk_l2norm=l2norm)
    for name in x:
        assert seg[name] is not None and seg[name].shape == x[name].shape, name
        torch.testing.assert_close(seg[name], whole[name], rtol=1e-5, atol=1e-6)
        assert _ratio(wy[name], seg[name]) < 1e-4, name


def test_reference_gradcheck_float64_tiny() -> None:
    """Finite differences on the reference's own step function (float64, tiny shape)."""
    gen = torch.Generator().manual_seed(3)
    shapes = {"state": (1, 2, 3, 3), "q": (1, 4, 2, 3), "k": (1, 4, 2, 3), "v": (1, 4, 2, 3), "g": (1, 4, 2),
              "beta": (1, 4, 2)}
    args = [torch.randn(*s, generator=gen, dtype=torch.float64) * (0.3 if n == "g" else 1.0)
            for n, s in shapes.items()]
    args = [a.requires_grad_(True) for a in args]
    assert torch.autograd.gradcheck(lambda *a: kt._ref_steps(*a), args, eps=1e-6, atol=1e-5)


def _upstream_roots(tmp: Path) -> List[Path]:
    """Unpacked fla-core sdists: $FLA_CORE_SRC, else 0.4.2 and 0.6.0 fetched from PyPI with the builder's own
    source stage (sha256-checked, safely extracted); skipped only when PyPI is unreachable."""
    given = [Path(p) for p in os.environ.get("FLA_CORE_SRC", "").split(os.pathsep) if p]
    if given:
        return given
    from builder.core.errors import SourceError
    from builder.core.settings import Settings
    from builder.stages.resolve import pypi_releases
    from builder.stages.source import fetch, unpack

    settings = Settings(cache_dir=tmp / "cache", wheelhouse=tmp / "wh", recipes_dir=tmp, patches_dir=tmp)
    try:
        releases = pypi_releases("fla-core", settings)
        return [unpack(fetch(releases[v], settings)[0], tmp / "src" / v) for v in ("0.4.2", "0.6.0")]
    except SourceError as e:
        pytest.skip(f"skipped: cannot fetch fla-core sdists from PyPI ({e.message})")


def _upstream_naive_modules(roots: List[Path]) -> List[Tuple[str, Any]]:
    found = []
    for root in roots:
        path = Path(root) / "fla" / "ops" / "gated_delta_rule" / "naive.py"
        if path.exists():
            spec = importlib.util.spec_from_file_location(f"fla_naive_{len(found)}", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            found.append((Path(root).name, module))
    return found


@pytest.mark.network
def test_reference_matches_fla_naive_from_sdists(tmp_path: Path) -> None:
    pytest.importorskip("einops", reason="skipped: einops (imported by fla's naive.py) is not installed")
    modules = _upstream_naive_modules(_upstream_roots(tmp_path))
    assert modules, "fla-core 0.4.2+ ships fla/ops/gated_delta_rule/naive.py"
    x = _inputs(t=70, h=2, hv=2, d=16, gate="qwen")
    o, ht = kt.ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                    output_final_state=True)
    for name, naive in modules:
        ro, rht = naive.naive_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"],
                                                          initial_state=x["h0"], output_final_state=True)
        co, cht = naive.naive_chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                      initial_state=x["h0"], output_final_state=True)
        assert _ratio(ro, o) < 1e-5 and _ratio(rht, ht) < 1e-5, name
        assert _ratio(co, o) < 1e-4 and _ratio(cht, ht) < 1e-4, name


# --------------------------------------------------------------------------- case design


@pytest.mark.parametrize("quick", [False, True])
def test_groups_share_autotune_keys_and_keep_every_case(quick: bool) -> None:
    cases = kt.build_cases(quick, {"gva_chunk": True, "gva_recurrent": True})
    groups = kt.FlaSuite().group_cases(cases)
    assert [c for g in groups for c in g] == sorted(cases, key=lambda c: [c in g for g in groups].index(True))
    assert sorted(c.name for g in groups for c in g) == sorted(c.name for c in cases)
    keys = [{(c.op, c.dtype, c.qk_heads, c.v_heads, c.g_dtype) for c in g} for g in groups]
    assert all(len(k) == 1 for k in keys)
    assert len({next(iter(k)) for k in keys}) == len(groups)  # one group per key
    assert len(groups) > 1  # there is something to run in parallel


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("gva_chunk", [False, True])
def test_case_design(quick: bool, gva_chunk: bool) -> None:
    cases = kt.build_cases(quick, {"gva_chunk": gva_chunk, "gva_recurrent": True})
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert (8 <= len(cases) <= 12) if quick else (30 <= len(cases) <= 45)
    for op in ("chunk", "recurrent"):
        mine = [c for c in cases if c.op == op]
        assert {c.dtype for c in mine} == {"fp16", "bf16"}
        assert {c.l2norm for c in mine} == {False, True}
        assert {c.gate for c in mine} == set(kt.GATES)
        assert "h0+ht" in {c.states for c in mine}
        assert any(c.seqlen % 64 for c in mine)  # an odd length that ends inside a chunk
        heads = {(c.qk_heads, c.v_heads) for c in mine}
        assert (32, 32) in heads
        assert ((16, 32) in heads) == (gva_chunk or op == "recurrent")
        if not quick:
            assert {c.states for c in mine} == set(kt.STATES)
    assert all(c.states == "h0+ht" for c in cases if c.seqlen == 1)
    pinned_heads = (16, 32) if gva_chunk else (16, 16)  # the Qwen3-Next training configuration, always there
    assert any(c.op == "chunk" and c.dtype == "bf16" and (c.qk_heads, c.v_heads) == pinned_heads
               and c.states == "h0+ht" and c.l2norm and c.gate == "qwen" for c in cases)
    if not gva_chunk:
        assert all("16/16 heads used" in c.note for c in cases if c.op == "chunk" and c.heads == "gva")


def test_feature_detection_from_source_and_version() -> None:
    def chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        return None

    def recurrent(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                  output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        return None

    f = kt.detect_features(chunk, recurrent, "H = k.shape[2]", "HV = v.shape[2]", "0.4.2")
    assert f == {"gva_chunk": False, "gva_recurrent": True, "l2norm_chunk": True, "l2norm_recurrent": True}
    assert kt.detect_features(chunk, recurrent, None, None, "0.5.0+cu130torch2.14")["gva_chunk"]
    assert not kt.detect_features(chunk, recurrent, None, None, "0.4.1")["gva_chunk"]


# --------------------------------------------------------------------------- the harness with fake kernels


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink the Qwen3-Next head layout so CPU runs are quick: 2 q/k heads, 4 value heads, dim 16."""
    monkeypatch.setattr(kt, "QK_HEADS", 2)
    monkeypatch.setattr(kt, "V_HEADS", 4)
    monkeypatch.setattr(kt, "HEAD_DIM", 16)


def _fake_kernel(fault: Optional[str] = None, backward: bool = True):
    """A CPU stand-in for fla's kernels with fla's keyword API: the chunked formulation, output in the input
    dtype and final state in fp32; `fault` plants a bug."""
    calls = {"n": 0}

    def fn(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
           output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        calls["n"] += 1
        if fault == "gva_tiled" and v.shape[2] != q.shape[2]:  # wrong head grouping: tile instead of interleave
            rep = v.shape[2] // q.shape[2]
            q, k = q.repeat(1, 1, rep, 1), k.repeat(1, 1, rep, 1)
        h0 = initial_state
        if fault == "drop_h0_grad" and h0 is not None:
            h0 = h0.detach()
        o, ht = chunked_gdr(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=output_final_state,
                            use_qk_l2norm=use_qk_l2norm_in_kernel)
        if fault == "output_3pct_off":
            o = torch.cat([o[:, :1], o[:, 1:] * 1.03], dim=1)
        if fault == "last_token":
            o = torch.cat([o[:, :-1], torch.zeros_like(o[:, -1:])], dim=1)
        if fault == "nan":
            o = o.contiguous().clone()
            o.view(-1)[0] = float("nan")
        if fault == "nondeterministic":
            o = o + 1e-3 * calls["n"] * o.detach().abs().mean()
        if not backward:
            o, ht = o.detach(), (ht.detach() if ht is not None else None)
        return o.to(v.dtype), ht

    return fn


def _api(fault: Optional[str] = None) -> Any:
    return kt.Api(chunk=_fake_kernel(fault), recurrent=_fake_kernel(fault, backward=False), version="0.6.0",
                  features={"gva_chunk": True, "gva_recurrent": True, "l2norm_chunk": True, "l2norm_recurrent": True},
                  flags={})


def _case(**kw: Any) -> Any:
    base = dict(op="chunk", dtype="bf16", batch=2, seqlen=70, heads="gva", states="h0+ht", l2norm=True,
                gate="qwen", g_dtype="fp32")
    base.update(kw)
    return kt._resolve_heads(kt.GdrCase(**base), {"gva_chunk": True, "gva_recurrent": True})


@pytest.mark.parametrize("case_kw", [
    {},
    {"dtype": "fp16", "heads": "mha32", "states": "none", "l2norm": False, "gate": "logsigmoid", "g_dtype": "input"},
    {"states": "ht", "gate": "weak", "seqlen": 65},
    {"op": "recurrent", "batch": 3, "seqlen": 1},
    {"op": "recurrent", "dtype": "fp16", "states": "none", "seqlen": 33},
])
def test_harness_passes_a_correct_kernel(small: None, case_kw: Dict[str, Any]) -> None:
    case = _case(**case_kw)
    [result] = kt.FlaSuite().run_one(_api(), case, CPU)
    assert result.status == "passed", result.detail
    tensors = {c["tensor"] for c in result.checks}
    expected = {"o"} | ({"ht"} if case.states != "none" else set())
    if case.op == "chunk":
        expected |= {"dq", "dk", "dv", "dg", "dbeta"} | ({"dh0"} if case.states == "h0+ht" else set())
    assert expected <= tensors
    assert {f"repeat:{t}" for t in expected} <= tensors
    assert all(c["ratio"] is not None and c["ratio"] < 1e-2 for c in result.checks if not c["tensor"].startswith("repeat"))


@pytest.mark.parametrize(("fault", "needle"), [
    ("gva_tiled", "o FAIL"),
    ("output_3pct_off", "o FAIL"),
    ("last_token", "o FAIL"),
    ("nan", "non-finite"),
    ("nondeterministic", "differ between two runs"),
    ("drop_h0_grad", "dh0 FAIL"),
])
def test_harness_catches_planted_faults(small: None, fault: str, needle: str) -> None:
    [result] = kt.FlaSuite().run_one(_api(fault), _case(seqlen=70), CPU)
    assert result.status == "failed"
    assert needle in result.detail, result.detail


def test_harness_turns_exceptions_into_failures(small: None) -> None:
    def broken(**kwargs):
        raise RuntimeError("triton compile error: ptxas fatal")

    api = _api()
    api.chunk = broken
    [result] = kt.FlaSuite().run_one(api, _case(), CPU)
    assert result.status == "failed" and result.detail.startswith("raised RuntimeError: triton compile error")


HOPPER_REFUSAL = ("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg "
                  "(see #640). Please upgrade Triton to >= 3.7.1 or install tilelang: `pip install tilelang`")


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, message):  # type: ignore[override]
        ctx.message = message
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        raise RuntimeError(ctx.message)


def _backward_raises(message: str, fault: Optional[str] = None):
    inner = _fake_kernel(fault)

    def fn(**kwargs):
        o, ht = inner(**kwargs)
        return _RaiseInBackward.apply(o, message), ht

    return fn


HOPPER_REFUSAL_050 = ("Triton >= 3.4.0 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg "
                      "(see #640). Please install tilelang: `pip install tilelang`")  # fla-core 0.5.0's wording


@pytest.mark.parametrize("message", [HOPPER_REFUSAL, HOPPER_REFUSAL_050])
@pytest.mark.parametrize("fault", [None, "output_3pct_off"])
def test_backward_refused_by_fla_is_skipped_and_forward_still_checked(small: None, fault: Optional[str],
                                                                      message: str) -> None:
    api = _api()
    api.chunk = _backward_raises(message, fault)
    fwd, bwd = kt.FlaSuite().run_one(api, _case(), CPU)
    assert fwd.name.endswith("/fwd") and bwd.name.endswith("/bwd")
    assert fwd.status == ("passed" if fault is None else "failed"), fwd.detail
    assert {c["tensor"] for c in fwd.checks} == {"o", "ht", "repeat:o", "repeat:ht"}
    assert bwd.status == "skipped" and "refused by fla-core itself" in bwd.detail and "#640" in bwd.detail


def test_other_backward_errors_still_fail(small: None) -> None:
    api = _api()
    api.chunk = _backward_raises("CUDA error: an illegal memory access was encountered")
    [result] = kt.FlaSuite().run_one(api, _case(), CPU)
    assert result.status == "failed" and "illegal memory access" in result.detail


def test_report_on_a_machine_without_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "r" / "result.json"
    code = kt.FlaSuite().main(["--out", str(out), "--quick"])
    data = json.loads(out.read_text())
    assert code == 3 and data["status"] == "skipped" and "no CUDA GPU" in data["reason"]
    assert data["counts"] == {"passed": 0, "failed": 0, "skipped": 0} and data["speed"] == []
    assert data["package"] == "fla-core" and data["quick"] is True and isinstance(data["seed"], int)


def test_finalize_and_json_safety(tmp_path: Path) -> None:
    report = kt.FlaSuite().new_report(1, False)
    report["cases"] = [{"name": "a", "status": "passed"}, {"name": "b", "status": "failed"},
                       {"name": "c", "status": "skipped"}]
    report["speed"] = [{"name": "x", "kernel_ms": float("nan")}]
    kt.kh.finalize(report)
    assert report["status"] == "failed" and report["counts"] == {"passed": 1, "failed": 1, "skipped": 1}
    kt.kh.write_report(report, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["speed"][0]["kernel_ms"] is None
    empty = kt.FlaSuite().new_report(1, False)
    kt.kh.finalize(empty)
    assert empty["status"] == "skipped" and empty["reason"] == "no case ran"


def test_tolerances_follow_upstream_and_scale_for_bf16() -> None:
    assert kt.ratio_tol("o", "fp16") == 0.005 and kt.ratio_tol("dq", "fp16") == 0.008
    assert kt.ratio_tol("dg", "fp16") == 0.02 and kt.ratio_tol("o", "bf16") == 0.01


def test_bitwise_and_ratio_checks() -> None:
    a = torch.randn(4, 5)
    assert kt.kh.check_equal("x", a, a.clone()).ok
    b = a.clone()
    b[0, 0] += 1e-6
    assert not kt.kh.check_equal("x", b, a).ok
    assert kt.kh.check_ratio("o", a + 1e-4 * torch.randn_like(a), a, 0.005).ok
    assert not kt.kh.check_ratio("o", a * 1.05, a, 0.005).ok
    assert kt.kh.check_ratio("o", a + 1e-7, a, 1e-9).ok  # tiny absolute difference passes, as upstream
    assert not kt.kh.check_ratio("o", a[:2], a, 0.005).ok
    assert "kernel returned no tensor" in kt.kh.check_ratio("dh0", None, a, 0.008).note


FAKE_FLA = {
    "fla/__init__.py": "",
    "fla/utils.py": "IS_NVIDIA_BLACKWELL = False\n",
    "fla/ops/__init__.py": "",
    "fla/ops/gated_delta_rule/__init__.py":
        "from .chunk import chunk_gated_delta_rule\nfrom .fused_recurrent import fused_recurrent_gated_delta_rule\n",
    "fla/ops/gated_delta_rule/chunk.py": (
        "import os, kernel_tests\n"
        "HV = 'grouped value heads'\n"
        "def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,\n"
        "                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):\n"
        "    print('worker pid', os.getpid(), flush=True)\n"
        "    o, ht = kernel_tests.ref_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,\n"
        "                                              use_qk_l2norm_in_kernel)\n"
        "    return o.to(v.dtype), ht\n"),
    "fla/ops/gated_delta_rule/fused_recurrent.py":
        "HV = 1\nfrom .chunk import chunk_gated_delta_rule as fused_recurrent_gated_delta_rule\n",
}

GROUPS_DRIVER = """
import json, os, sys
from pathlib import Path
import torch
import kernel_tests as kt
if __name__ == "__main__":
    cases = [c for c in kt.build_cases(True, {"gva_chunk": True, "gva_recurrent": True}) if c.seqlen <= 70]
    cases = [kt.replace(c, batch=1) for c in cases]
    groups = kt.FlaSuite().group_cases(cases)
    report = kt.FlaSuite().new_report(7, True)
    report["cases"] = [{"name": "device_flags/IS_NVIDIA_BLACKWELL", "status": "passed", "detail": ""}]
    rows = kt.FlaSuite().run_groups(report, Path(sys.argv[1]), cases, 2, None, torch.device("cpu"))
    print(json.dumps({"groups": len(groups), "cases": len(cases), "rows": rows, "driver": str(os.getpid())}))
"""


def test_parallel_groups_in_spawned_workers(tmp_path: Path) -> None:
    """The --jobs path end to end on CPU: spawned workers import the suite, run their group against a stand-in
    fla (the reference itself), every case comes back once, and the partial report is on disk."""
    for rel, text in FAKE_FLA.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    driver = tmp_path / "driver.py"
    driver.write_text(GROUPS_DRIVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(HERE)]))
    out = tmp_path / "partial.json"
    proc = subprocess.run([sys.executable, str(driver), str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["groups"] >= 2
    assert sorted(r["name"] for r in result["rows"]) == sorted({r["name"] for r in result["rows"]})
    assert len(result["rows"]) == result["cases"]
    assert all(r["status"] == "passed" for r in result["rows"]), [r["detail"] for r in result["rows"]]
    pids = {line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("worker pid")}
    # spawned workers did the work, at most --jobs of them (which worker takes which group is the pool's choice:
    # one that starts first may run them all)
    assert 1 <= len(pids) <= 2 and result["driver"] not in pids and str(os.getpid()) not in pids
    partial = json.loads(out.read_text())
    assert partial["status"] == "incomplete" and len(partial["cases"]) == result["cases"] + 1
    assert partial["cases"][0]["name"] == "device_flags/IS_NVIDIA_BLACKWELL"  # what ran before the groups stays
