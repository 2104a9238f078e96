"""CPU checks for kernel_tests.py: its fp32 gated-delta-rule reference against an independent chunked
(WY / triangular-solve) formulation and against upstream's semantics, its case design, and the whole harness
against fake CPU "kernels", good and broken.

Run: python -m pytest recipes/fla-core/test_reference_cpu.py
The reference is also compared with upstream's own fla/ops/gated_delta_rule/naive.py of 0.4.2 and 0.6.0 (sdists
fetched from PyPI, or unpacked ones named in FLA_CORE_SRC; loaded by path; needs einops, not triton).
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
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
    # the chunk kernels autotune on the head dims (K, V): one group per pair, never two pairs in one worker
    assert all(len({c.dims for c in g}) == 1 for g in groups if g[0].op == "chunk")
    # fused_recurrent's boundary cases (a compile per head-dim pair) run apart from its other cases
    assert all(len({c.family in ("dims", "varlen") for c in g}) == 1 for g in groups if g[0].op == "recurrent")
    full_keys = [kt.group_key(g[0]) for g in groups]
    assert len(set(full_keys)) == len(groups)  # one group per key
    assert len(groups) > 1  # there is something to run in parallel


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("gva_chunk", [False, True])
def test_case_design(quick: bool, gva_chunk: bool) -> None:
    every = kt.build_cases(quick, {"gva_chunk": gva_chunk, "gva_recurrent": True})
    names = [c.name for c in every]
    assert len(names) == len(set(names))
    cases = [c for c in every if not c.family]  # the sampled design (the boundary families are tested below)
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
    assert f == {"gva_chunk": False, "gva_recurrent": True, "l2norm_chunk": True, "l2norm_recurrent": True,
                 "varlen_chunk": True, "varlen_recurrent": True}
    assert not kt.detect_features(lambda q, k, v, g, beta: None, recurrent, None, None, "0.6.0")["varlen_chunk"]
    assert kt.detect_features(chunk, recurrent, None, None, "0.5.0+cu130torch2.14")["gva_chunk"]
    assert not kt.detect_features(chunk, recurrent, None, None, "0.4.1")["gva_chunk"]

# --------------------------------------------------------------------------- boundary families (issue 50)

FEATURES = {"gva_chunk": True, "gva_recurrent": True, "l2norm_chunk": True, "l2norm_recurrent": True,
            "varlen_chunk": True, "varlen_recurrent": True}
# Exact sizes of the design (fla-core 0.6.0's tilings): 37 sampled cases + 24 sequence lengths x 2 dtypes
# + 4 varlen batches x 2 ops x 2 dtypes + 7 chunk head-dim pairs + 12 fused_recurrent head-dim pairs = 120;
# --quick: 9 sampled + 7 seeded sequence-length / varlen + 1 chunk pair + 2 recurrent pairs = 19.
FULL_CASES, QUICK_CASES = 120, 19
FULL_GROUPS, QUICK_GROUPS = 25, 11  # distinct Triton compile / autotune keys (worker groups)


def test_tilings_are_declared_with_their_source() -> None:
    assert {(t.axis, t.chunk) for t in kt.TILINGS} == {("T", 64), ("T", 16), ("K", 64), ("V", 64), ("V", 8)}
    for t in kt.TILINGS:
        assert isinstance(t, kh.Tiling) and t.kernel and t.vec == 1
        assert "ops/" in t.source and ".py:" in t.source and "`" in t.source, t  # file, line and the text
    assert "chunk_size', 64)" in kt.T_CHUNK.source and "BC = 16" in kt.T_SUBCHUNK.source
    assert "K <= 256" in kt.K_BLOCK.source and "min(8" in kt.REC_V_BLOCK.source and kt.MAX_K == 256


def _values(cases: List[Any], attr: str, **where: Any) -> set:
    mine = [c for c in cases if all(getattr(c, k) == v for k, v in where.items())]
    if attr == "K":
        return {c.dims[0] for c in mine}
    if attr == "V":
        return {c.dims[1] for c in mine}
    return {getattr(c, attr) for c in mine}


def test_every_declared_boundary_is_in_the_full_design() -> None:
    cases = kt.build_cases(False, FEATURES)
    for dtype in ("fp16", "bf16"):
        seqlens = _values(cases, "seqlen", op="chunk", dtype=dtype, family="T")
        assert set(kt.T_CHUNK.boundaries(chunks=2)) <= seqlens  # 1, 2, 63, 64, 65, 66, 127, 128, 129, 130, 191
        assert set(kt.T_SUBCHUNK.boundaries(chunks=4)) <= seqlens  # 15, 16, 17, 31, ..., 79
        assert {1, 63, 64, 65, 127, 128, 129} <= seqlens
    # head dims: every boundary of the 64-wide K and V blocks (even, >= 16; odd ones moved one step outwards), K's
    # limit 256; fused_recurrent: every boundary of its 8-wide V block and of the 64-wide edges, odd ones too
    for tiling, attr in ((kt.K_BLOCK, "K"), (kt.V_BLOCK, "V")):
        chunk_dims = _values(cases, attr, op="chunk") | {kt.DESIGN_HEAD_DIM}
        expect = {kt._even_dim(b, 64) for b in tiling.boundaries(chunks=2) if b >= 16} | {256}
        assert expect <= chunk_dims, (attr, expect - chunk_dims)
        assert {62, 64, 66, 126, 128, 130, 190, 256} <= chunk_dims
    assert set(kt.K_BLOCK.boundaries(chunks=2)) | {256} <= _values(cases, "K", op="recurrent", family="dims")
    assert set(kt.REC_V_BLOCK.boundaries(chunks=2)) <= _values(cases, "V", op="recurrent", family="dims")
    assert all(c.dims[0] <= kt.MAX_K for c in cases)
    assert all(c.dims[0] % 2 == 0 and c.dims[1] % 2 == 0 for c in cases if c.op == "chunk")
    # each boundary case: state in and out (dh0 checked), forward and backward for chunk
    for c in cases:
        if c.family:
            assert c.states == "h0+ht" and (c.op == "recurrent" or c.backward), c.name
            assert "boundary-" + c.family in c.name
    lens = {c.lengths for c in cases if c.family == "varlen"}
    assert lens == set(kt.varlen_batches())
    assert {(c.op, c.dtype) for c in cases if c.family == "varlen"} == {
        (op, d) for op in ("chunk", "recurrent") for d in ("fp16", "bf16")}


def test_varlen_batches_put_sequence_ends_at_around_and_between_chunk_boundaries() -> None:
    c, s = kt.T_CHUNK.chunk, kt.T_SUBCHUNK.chunk
    seqlens = set(kt.boundary_seqlens())
    ends = []
    for lens in kt.varlen_batches():
        assert set(lens) <= seqlens and 1 in lens
        assert any(n % c and i < len(lens) - 1 for i, n in enumerate(lens))  # a partial tail with a neighbour after
        ends += list(itertools.accumulate(lens))
    assert {e % c for e in ends} >= {0, 1, c - 1}  # at, just after and just before chunk boundaries
    assert {e % s for e in ends} >= {0, 1, s - 1}
    assert sum(lens.count(1) for lens in kt.varlen_batches()) >= 4  # length-1 sequences
    cu = kt.cu_seqlens_of((1, 63, 64), CPU)
    assert cu.tolist() == [0, 1, 64, 128] and cu.dtype == torch.long


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 2])
def test_quick_keeps_boundary_shapes(seed: int) -> None:
    torch.manual_seed(seed)
    cases = kt.build_cases(True, FEATURES)
    assert len(cases) == QUICK_CASES
    chunk_t = _values(cases, "seqlen", op="chunk", family="T")
    assert {63, 64, 65} <= chunk_t  # always kept: a 63-row tail, exactly one chunk, a one-row tail
    assert kt.varlen_batches()[0] in _values(cases, "lengths", op="chunk", family="varlen")
    assert len([c for c in cases if c.op == "chunk" and c.family == "dims"]) == 1
    assert len([c for c in cases if c.op == "recurrent" and c.family == "dims"]) == 2
    assert len([c for c in cases if c.family]) == 10 and len([c for c in cases if not c.family]) == 9
    assert len(kt.FlaSuite().group_cases(cases)) == QUICK_GROUPS
    torch.manual_seed(seed)
    assert [c.name for c in kt.build_cases(True, FEATURES)] == [c.name for c in cases]  # the seed repeats a run


def test_exact_case_and_group_counts() -> None:
    torch.manual_seed(7)
    full, quick = kt.build_cases(False, FEATURES), kt.build_cases(True, FEATURES)
    assert (len(full), len(quick)) == (FULL_CASES, QUICK_CASES)
    families = {f: len([c for c in full if c.family == f]) for f in ("", "T", "varlen", "dims")}
    assert families == {"": 37, "T": 48, "varlen": 16, "dims": 19}
    assert len(kt.FlaSuite().group_cases(full)) == FULL_GROUPS
    assert len(kt.FlaSuite().group_cases(quick)) == QUICK_GROUPS
    names = [c.name for c in full]
    assert len(set(names)) == len(names)
    # the sampled design's names are unchanged by the new fields
    assert "chunk/bf16/B2/T1000/h16v32/h0+ht/l2norm_in_kernel/gate_qwen/g_fp32/fwd+bwd" in names
    assert [n for n in names if "boundary" in n] == [c.name for c in full if c.family]
    assert sum(bool(re.search("boundary", n)) for n in names) == FULL_CASES - 37  # what `--only boundary` runs



# --------------------------------------------------------------------------- the harness with fake kernels


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink the Qwen3-Next head layout so CPU runs are quick: 2 q/k heads, 4 value heads, dim 16."""
    monkeypatch.setattr(kt, "QK_HEADS", 2)
    monkeypatch.setattr(kt, "V_HEADS", 4)
    monkeypatch.setattr(kt, "HEAD_DIM", 16)


BT = kt.T_CHUNK.chunk  # the chunk the planted boundary faults are keyed on


def _fake_sequences(q, k, v, g, beta, scale, h0, want_final, l2norm, lengths, fault):
    """The packed sequences of a varlen call one by one (fla's semantics); ``chunk_tail_63`` and
    ``varlen_tail_chunk`` plant boundary faults."""
    outs, finals, start = [], [], 0
    for i, n in enumerate(lengths):
        part = [x[:, start:start + n] for x in (q, k, v, g, beta)]
        h0_i = h0[i:i + 1] if h0 is not None else None
        o, ht = chunked_gdr(*part, scale=scale, initial_state=h0_i, output_final_state=True, use_qk_l2norm=l2norm)
        if fault == "varlen_tail_chunk" and n > BT and n % BT:
            # the sequence's last, partial chunk never reaches its final state
            full = n - n % BT
            _, ht = chunked_gdr(*(x[:, :full] for x in part), scale=scale, initial_state=h0_i,
                                output_final_state=True, use_qk_l2norm=l2norm)
        if fault == "chunk_tail_63" and n % BT == BT - 1:
            o = torch.cat([o[:, :-1], torch.zeros_like(o[:, -1:])], dim=1)  # a 63-row last chunk loses its last row
        outs.append(o)
        finals.append(ht)
        start += n
    return torch.cat(outs, dim=1), (torch.cat(finals, dim=0) if want_final else None)


def _fake_kernel(fault: Optional[str] = None, backward: bool = True):
    """A CPU stand-in for fla's kernels with fla's keyword API (cu_seqlens too): the chunked formulation, output
    in the input dtype and final state in fp32; `fault` plants a bug. The boundary faults (``chunk_tail_63``,
    ``varlen_tail_chunk``) are planted in the chunk stand-in only (``backward``): fused_recurrent has no chunks."""
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
        boundary_fault = fault if backward and fault in ("chunk_tail_63", "varlen_tail_chunk") else None
        if cu_seqlens is not None:
            assert q.shape[0] == 1 and cu_seqlens.dtype == torch.long and int(cu_seqlens[-1]) == q.shape[1]
            assert h0 is None or h0.shape[0] == len(cu_seqlens) - 1
            lengths = torch.diff(cu_seqlens).tolist()
            o, ht = _fake_sequences(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                                    lengths, boundary_fault)
        elif boundary_fault == "chunk_tail_63":
            rows = [_fake_sequences(*(x[b:b + 1] for x in (q, k, v, g, beta)), scale,
                                    h0[b:b + 1] if h0 is not None else None, output_final_state,
                                    use_qk_l2norm_in_kernel, [q.shape[1]], boundary_fault) for b in range(q.shape[0])]
            o = torch.cat([r[0] for r in rows], dim=0)
            ht = torch.cat([r[1] for r in rows], dim=0) if output_final_state else None
        else:
            o, ht = chunked_gdr(q, k, v, g, beta, scale=scale, initial_state=h0,
                                output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm_in_kernel)
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
                  features=dict(FEATURES), flags={})


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


def test_varlen_reference_runs_each_sequence_from_its_own_state() -> None:
    lens = (1, 5, 16, 3)
    x = _inputs(b=1, t=sum(lens), h=2, hv=4)
    h0 = torch.randn(len(lens), 4, 8, 8)
    o, ht = kt.ref_varlen_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], lens, initial_state=h0,
                                           output_final_state=True)
    assert o.shape == x["v"].shape and ht.shape == h0.shape
    start = 0
    for i, n in enumerate(lens):
        part = [x[name][:, start:start + n] for name in ("q", "k", "v", "g", "beta")]
        oi, hi = kt.ref_gated_delta_rule(*part, initial_state=h0[i:i + 1], output_final_state=True)
        torch.testing.assert_close(o[:, start:start + n], oi)
        torch.testing.assert_close(ht[i:i + 1], hi)
        start += n
    # no state handed from one sequence to the next: zeros in, not the previous sequence's final state
    o0, _ = kt.ref_varlen_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], lens)
    o1, _ = kt.ref_gated_delta_rule(*(x[name][:, 1:6] for name in ("q", "k", "v", "g", "beta")))
    torch.testing.assert_close(o0[:, 1:6], o1)


def _boundary(family: str, op: str = "chunk", **kw: Any) -> Any:
    [case] = [c for c in kt.boundary_cases(False) if c.family == family and c.op == op
              and all(getattr(c, k) == v for k, v in kw.items())][:1]
    return kt._resolve_heads(case, FEATURES)


@pytest.mark.parametrize(("family", "op", "kw"), [
    ("T", "chunk", {"seqlen": 63, "dtype": "bf16"}),
    ("T", "chunk", {"seqlen": 1, "dtype": "fp16"}),
    ("varlen", "chunk", {"lengths": kt.varlen_batches()[1], "dtype": "bf16"}),
    ("varlen", "recurrent", {"lengths": kt.varlen_batches()[3], "dtype": "fp16"}),
    ("dims", "chunk", {"k_dim": 66, "v_dim": 130}),
    ("dims", "recurrent", {"k_dim": 1, "v_dim": 23}),
    ("dims", "recurrent", {"k_dim": 65, "v_dim": 15}),
])
def test_harness_passes_a_correct_kernel_on_boundary_shapes(small: None, family: str, op: str,
                                                            kw: Dict[str, Any]) -> None:
    case = _boundary(family, op, **kw)
    [result] = kt.FlaSuite().run_one(_api(), case, CPU)
    assert result.status == "passed", result.detail
    tensors = {c["tensor"] for c in result.checks}
    expected = {"o", "ht"} | ({"dq", "dk", "dv", "dg", "dbeta", "dh0"} if op == "chunk" else set())
    assert expected <= tensors, tensors
    assert {f"repeat:{t}" for t in expected} <= tensors


def _old_design_chunk_shapes() -> List[Any]:
    """One case per (batch, seqlen) of the sampled design's chunk cases: what it could catch of a fault keyed on
    the sequence's shape (the other factors do not change where a sequence ends)."""
    seen: Dict[Tuple[int, int], Any] = {}
    for c in kt.build_cases(False, FEATURES):
        if c.op == "chunk" and not c.family:
            seen.setdefault((c.batch, c.seqlen), c)
    return list(seen.values())


def _fault_shows(fault: str, case: Any) -> bool:
    """Whether the planted fault changes anything the suite checks (o, ht, every gradient) on this case's shape:
    the faulty and the correct stand-in on the same tiny inputs (1 q/k head, 2 value heads, dim 4)."""
    n_seqs = len(case.lengths) if case.lengths else case.batch
    x = _inputs(b=case.batch, t=case.seqlen, h=1, hv=2, d=4, seed=case.seqlen)
    x["h0"] = torch.randn(n_seqs, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    cu = kt.cu_seqlens_of(case.lengths, CPU) if case.lengths else None
    results = []
    for planted in (None, fault):
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        o, ht = _fake_kernel(planted)(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"],
                                      beta=leaves["beta"], initial_state=leaves["h0"], output_final_state=True,
                                      cu_seqlens=cu)
        (o.float().sum() + (ht * ht).sum()).backward()
        results.append([o, ht, *(leaves[n].grad for n in x)])
    # (to rounding: the faulty stand-in runs a batch row by row)
    return any(not torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize(("fault", "needle"), [
    ("chunk_tail_63", "o FAIL"),  # a last chunk of 63 rows loses its last row's output
    ("varlen_tail_chunk", "ht FAIL"),  # a varlen sequence's last partial chunk never reaches its final state
])
def test_boundary_faults_are_caught_by_the_boundary_cases_and_missed_by_the_sampled_design(
        small: None, fault: str, needle: str) -> None:
    old = _old_design_chunk_shapes()
    assert {(c.batch, c.seqlen) for c in old} == {(1, 1024), (2, 1000), (2, 65)}
    # the sampled design cannot see it: on each of its shapes the faulty stand-in computes exactly what the correct
    # one does (outputs, final state, every gradient)
    assert not any(_fault_shows(fault, c) for c in old)
    family = "T" if fault == "chunk_tail_63" else "varlen"
    boundary = [kt._resolve_heads(c, FEATURES) for c in kt.boundary_cases(False)
                if c.op == "chunk" and c.family == family and c.dtype == "bf16"]
    showing = [c for c in boundary if _fault_shows(fault, c)]
    if fault == "chunk_tail_63":
        assert [c.seqlen for c in showing] == [63, 127, 191]
    else:
        assert len(showing) == len(kt.varlen_batches())  # each batch has a sequence > 64 with a partial last chunk
    # the suite reports it: the harness fails such a case and names the tensor
    [result] = kt.FlaSuite().run_one(_api(fault), showing[0], CPU)
    assert result.status == "failed" and needle in result.detail, result.detail
    [result] = kt.FlaSuite().run_one(_api(), showing[0], CPU)
    assert result.status == "passed", result.detail
    # --quick, whatever its seed, keeps a case that shows it
    names = {c.name for c in showing}
    for seed in (0, 1, 2, 3):
        torch.manual_seed(seed)
        assert names & {c.name for c in kt.build_cases(True, FEATURES)}


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
    cases = [c for c in kt.build_cases(True, {"gva_chunk": True, "gva_recurrent": True})
             if c.seqlen <= 70 and not c.family]
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
