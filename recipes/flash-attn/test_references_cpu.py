"""CPU checks for kernel_tests.py (flash-attn): the fp32 reference against torch's SDPA and plain loops, the
case design against the tiling facts, and the whole comparison against a CPU stand-in "kernel" (the reference
itself, with planted faults): the unfaulted one must pass, each fault must be flagged where it lives.

Run: python -m pytest recipes/flash-attn/test_references_cpu.py
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_harness"))
import kernel_harness as kh  # noqa: E402 (the shared harness beside the recipes)

kt = kh.load_suite(HERE / "kernel_tests.py", "flash_attn_kernel_tests")

CPU = torch.device("cpu")
TIGHT = dict(rtol=1e-5, atol=1e-5)
# The H100 profile with a few SMs, so the "std" path needs a small batch on CPU (the paths stay as on the GPU)
CPU_PROFILE = replace(kt.PROFILES["sm90"], name="cpu-sm90", sms=8)


# --------------------------------------------------------------------------- the reference vs SDPA and loops


def _qkv(b: int, sq: int, sk: int, h: int, hk: int, d: int) -> tuple[torch.Tensor, ...]:
    return torch.randn(b, sq, h, d), torch.randn(b, sk, hk, d), torch.randn(b, sk, hk, d)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
          scale: float | None = None) -> torch.Tensor:
    """torch's SDPA (math path on CPU) in FA's (b, s, h, d) layout, GQA by repeating kv heads; mask: True keeps."""
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         scale=scale)
    return out.transpose(1, 2)


def _loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
          window: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Element by element, straight from flash_attn_func's docstring (fp64): the key range, softcap, alibi, an
    empty row outputs 0 with LSE -inf; causal alibi as FA's kernels add it (+ slope * j, so FA's LSE)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    fa_causal = (causal or window[1] == 0) and window[0] < 0  # flash_api.cpp's params.is_causal
    out = torch.zeros(b, sq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, sq), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            for i in range(sq):
                pos = i + sk - sq
                lo = 0 if window[0] < 0 else pos - window[0]
                hi_ = pos if causal else (sk - 1 if window[1] < 0 else pos + window[1])
                keys = [j for j in range(sk) if lo <= j <= hi_]
                if not keys:
                    continue
                logits = []
                for j in keys:
                    s = float(q[bi, i, hi].double() @ k[bi, j, kv].double()) / math.sqrt(d)
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if alibi is not None and fa_causal:  # mask.h:180-182: + slope * j on every row
                        s += float(alibi[bi, hi]) * j
                    elif alibi is not None:
                        s -= float(alibi[bi, hi]) * abs(pos - j)
                    logits.append(s)
                top = max(logits)
                weights = [math.exp(s - top) for s in logits]
                total = sum(weights)
                for w, j in zip(weights, keys, strict=True):
                    out[bi, i, hi] += w / total * v[bi, j, kv].double()
                lse[bi, hi, i] = top + math.log(total)
    return out, lse


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 7), (7, 3), (1, 9)])
@pytest.mark.parametrize("heads", ["mha", "gqa", "mqa"])
def test_reference_matches_sdpa(sq: int, sk: int, heads: str) -> None:
    h, hk = kt.HEADS[heads]
    q, k, v = _qkv(2, sq, sk, h, hk, 16)
    out, lse = kt.ref_attention(q, k, v)
    torch.testing.assert_close(out, _sdpa(q, k, v), **TIGHT)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(h // hk, 2)) / 4.0
    torch.testing.assert_close(lse, scores.logsumexp(-1), **TIGHT)


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 7), (9, 4)])
def test_causal_is_bottom_right_aligned_like_sdpa_with_an_explicit_mask(sq: int, sk: int) -> None:
    """FA's causal mask keeps j <= i + sk - sq (not SDPA's is_causal, which is top-left aligned); rows without a
    key output 0 (SDPA would give NaN there, so those rows are compared with 0)."""
    q, k, v = _qkv(1, sq, sk, 2, 2, 8)
    keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
    out, lse = kt.ref_attention(q, k, v, causal=True)
    rows = keep.any(-1)
    torch.testing.assert_close(out[:, rows], _sdpa(q, k, v, keep)[:, rows], **TIGHT)
    assert torch.equal(out[:, ~rows], torch.zeros_like(out[:, ~rows]))
    assert bool(torch.isneginf(lse[..., ~rows]).all()) and bool(torch.isfinite(lse[..., rows]).all())
    if sq == sk:  # equal lengths: the same as SDPA's own causal flag
        torch.testing.assert_close(out, _sdpa_causal(q, k, v), **TIGHT)


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


@pytest.mark.parametrize("window,causal", [((2, 1), False), ((0, 0), False), ((3, -1), False), ((-1, 2), False),
                                           ((2, 5), True)])
def test_window_matches_sdpa_with_the_band_mask(window: tuple[int, int], causal: bool) -> None:
    q, k, v = _qkv(2, 6, 9, 4, 2, 8)
    pos = torch.arange(6)[:, None] + 3
    col = torch.arange(9)[None, :]
    right = 0 if causal else window[1]
    keep = torch.ones(6, 9, dtype=torch.bool)
    if right >= 0:
        keep &= col <= pos + right
    if window[0] >= 0:
        keep &= col >= pos - window[0]
    out, _ = kt.ref_attention(q, k, v, window=window, causal=causal)
    torch.testing.assert_close(out, _sdpa(q, k, v, keep), **TIGHT)


def test_alibi_matches_sdpa_with_an_additive_bias() -> None:
    q, k, v = _qkv(2, 5, 7, 4, 1, 8)
    alibi = torch.rand(2, 4) * 0.3
    dist = (torch.arange(5)[:, None] + 2 - torch.arange(7)[None, :]).abs().float()
    bias = -(alibi[:, :, None, None] * dist)
    out, _ = kt.ref_attention(q, k, v, alibi=alibi)
    torch.testing.assert_close(out, _sdpa(q, k, v, bias), **TIGHT)
    out_h, _ = kt.ref_attention(q[:1], k[:1], v[:1], alibi=alibi[0])  # (h,) slopes
    torch.testing.assert_close(out_h, out[:1], **TIGHT)


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 9), (6, 4)])
def test_causal_alibi_lse_is_fas_higher_by_slope_times_position(sq: int, sk: int) -> None:
    """The reference's causal alibi output is the documented one (- slope * |i + sk - sq - j|, as SDPA with that
    bias), and its LSE is FA's: the documented LSE + slope * (i + sk - sq) (mask.h adds + slope * j); a
    non-causal alibi LSE is the documented one."""
    q, k, v = _qkv(2, sq, sk, 4, 2, 8)
    alibi = torch.rand(2, 4) * 0.3 + 0.05
    pos = torch.arange(sq)[:, None] + sk - sq
    keep = torch.arange(sk)[None, :] <= pos
    bias = (-(alibi[:, :, None, None] * (pos - torch.arange(sk)[None, :]).abs())).masked_fill(~keep, -math.inf)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) / math.sqrt(8) + bias
    rows = keep.any(-1)
    out, lse = kt.ref_attention(q, k, v, causal=True, alibi=alibi)
    torch.testing.assert_close(out[:, rows], _sdpa(q, k, v, bias)[:, rows], **TIGHT)
    want = scores.logsumexp(-1) + alibi[:, :, None] * pos[:, 0].float()
    torch.testing.assert_close(lse[..., rows], want[..., rows], **TIGHT)
    assert bool(torch.isneginf(lse[..., ~rows]).all())
    _, lse_full = kt.ref_attention(q, k, v, alibi=alibi)
    dist = (pos - torch.arange(sk)[None, :]).abs().float()
    full = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) / math.sqrt(8) - alibi[:, :, None, None] * dist
    torch.testing.assert_close(lse_full, full.logsumexp(-1), **TIGHT)


@pytest.mark.parametrize("opts", [dict(softcap=1.5), dict(softcap=1.5, causal=True), dict(window=(2, 1)),
                                  dict(causal=True, alibi=True), dict(window=(1, 0), softcap=2.0, alibi=True)])
def test_reference_matches_the_loop(opts: dict[str, Any]) -> None:
    """Softcap (SDPA has none) and the combinations against the element-by-element formula, LSE included."""
    q, k, v = _qkv(2, 5, 8, 4, 2, 8)
    alibi = torch.rand(2, 4) * 0.3 if opts.pop("alibi", False) else None
    out, lse = kt.ref_attention(q, k, v, alibi=alibi, **opts)
    want, want_lse = _loop(q, k, v, alibi=alibi, **opts)
    torch.testing.assert_close(out.double(), want, **TIGHT)
    torch.testing.assert_close(lse.double(), want_lse, **TIGHT)


def test_reference_backward_matches_sdpa_and_has_no_nan_on_empty_rows() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(1, 7, 4, 4, 2, 8))
    keep = torch.arange(4)[None, :] <= torch.arange(7)[:, None] - 3
    out, _ = kt.ref_attention(q, k, v, causal=True)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    assert all(bool(torch.isfinite(g).all()) for g in got)
    rows = keep.any(-1)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    sd = _sdpa(q2[:, rows], k2, v2, keep[rows])
    want = torch.autograd.grad(sd, (q2, k2, v2), grad[:, rows])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TIGHT)


def test_low_precision_reference_is_in_the_dtype_and_close() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(1, 9, 11, 2, 1, 16))
    out_pt, _ = kt.ref_attention(q, k, v, causal=True, upcast=False)
    out, _ = kt.ref_attention(q, k, v, causal=True)
    assert out_pt.dtype == torch.bfloat16 and out.dtype == torch.float32
    assert 0 < kt.max_err(out_pt, out) < 0.05


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotate_matches_a_complex_rotation(interleaved: bool) -> None:
    x = torch.randn(2, 3, 2, 32)
    angle = torch.rand(10, 8) * 6.28
    pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    got = kt.rotate(x, angle.cos(), angle.sin(), pos, interleaved)
    rd = 16
    xr = x[..., :rd]
    pairs = torch.stack((xr[..., ::2], xr[..., 1::2]), -1) if interleaved else torch.stack(xr.chunk(2, -1), -1)
    z = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones(()), angle[pos])[:, :, None, :]
    back = torch.view_as_real(z)
    want = back.flatten(-2) if interleaved else torch.cat([back[..., 0], back[..., 1]], -1)
    torch.testing.assert_close(got[..., :rd], want, **TIGHT)
    assert torch.equal(got[..., rd:], x[..., rd:])


# --------------------------------------------------------------------------- tiling facts and case design


def test_tiles_follow_the_launch_templates() -> None:
    h100, a100, sm86, sm120 = (kt.PROFILES[n] for n in ("sm90", "sm80", "sm86", "sm120"))
    assert [(t.block_m, t.block_n) for t in (kt.fwd_tile(d, False, h100) for d in kt.HEAD_DIM_TEMPLATES)] == [
        (128, 128), (128, 128), (128, 64), (128, 64), (128, 64), (64, 64)]
    assert (kt.fwd_tile(256, False, a100).block_m, kt.fwd_tile(256, False, sm120).block_m) == (128, 64)
    assert (kt.fwd_tile(128, False, sm86).block_n, kt.fwd_tile(128, True, sm86).block_m) == (32, 64)
    assert (kt.fwd_tile(128, False, sm120).block_n, kt.fwd_tile(96, True, sm86).block_m) == (64, 64)  # sm120: not sm8x
    assert [(t.block_m, t.block_n) for t in (kt.bwd_tile(d, h100) for d in kt.HEAD_DIM_TEMPLATES)] == [
        (128, 128), (128, 128), (64, 128), (64, 128), (64, 64), (64, 64)]
    assert [(t.block_m, t.block_n) for t in (kt.bwd_tile(d, sm120) for d in kt.HEAD_DIM_TEMPLATES)] == [
        (128, 128), (64, 128), (64, 128), (64, 64), (64, 64), (64, 32)]
    assert [kt.split_tile(d).block_n for d in kt.HEAD_DIM_TEMPLATES] == [256, 256, 128, 128, 64, 64]
    assert [kt.head_dim_template(d) for d in (1, 29, 32, 33, 40, 59, 64, 100, 136, 250)] == [
        32, 32, 32, 64, 64, 64, 64, 128, 192, 256]
    assert all(t.source and ":" in t.source for t in kt.tilings(h100))


def test_num_splits_heuristic_like_flash_api() -> None:
    assert kt.num_splits_heuristic(300, 264, 10, 128) == 1  # enough blocks: no split
    assert kt.num_splits_heuristic(4, 264, 2, 128) == 2
    assert kt.num_splits_heuristic(4, 264, 64, 128) >= 40  # few blocks, long keys: many splits
    h100 = kt.PROFILES["sm90"]
    assert kt.expected_splits(1, 4, 128, 1, 129, h100) > 1 and kt.expected_splits(1, 4, 128, 1, 128, h100) == 1
    for prof in kt.PROFILES.values():  # the paths the runner's batch asks for, on every known GPU
        for d in kt.HEAD_DIM_TEMPLATES:
            for sq, sk in ((1, 600), (130, 515)):
                b = kt.batch_for_path("std", 6, d, sq, sk, prof)
                assert kt.expected_splits(b, 6, d, sq, sk, prof) == 1
                assert kt.expected_splits(1, 4, d, sq, sk, prof) > 1


@pytest.mark.parametrize("profile", sorted(kt.PROFILES))
def test_every_tile_boundary_is_in_the_full_design(profile: str) -> None:
    prof = kt.PROFILES[profile]
    cases = kt.build_cases(prof, quick=False)
    for t in kt.HEAD_DIM_TEMPLATES:
        edge = [c for c in cases if c.family == "edge_seq" and c.hdim == t]
        for path in ("std", "split"):
            qs, ks = kt.edge_lengths(t, prof, path)
            got = [c for c in edge if c.path == path]
            for causal in (False, True):
                assert {c.seqlen_q for c in got if c.causal == causal} >= set(qs)
                assert {c.seqlen_k for c in got if c.causal == causal} >= set(ks)
        fwd = kt.fwd_tile(t, False, prof)
        for n in (fwd.block_n - 1, fwd.block_n, fwd.block_n + 1, 2 * fwd.block_n + 1):
            assert n in {c.seqlen_k for c in edge}
        bwd = kt.bwd_tile(t, prof)
        assert {bwd.block_m + 1, bwd.block_n + 1} <= {c.seqlen_q for c in edge} | {c.seqlen_k for c in edge}
        assert (fwd.block_m, fwd.block_n) in {(c.seqlen_q, c.seqlen_k) for c in edge}  # the even path
        assert 1 in {c.seqlen_q for c in edge} and 1 in {c.seqlen_k for c in edge}
        assert any(c.seqlen_q != c.seqlen_k for c in edge)
        assert {c.hdim for c in cases if c.family == "edge_hdim"} >= set(kt.edge_hdim_values(t))
    assert all(c.path == "split" for c in cases if c.family == "edge_seq" and c.seqlen_k > 2 * 256 + 2)
    for fam in ("base", "varlen", "kvcache"):
        got = [c for c in cases if c.family == fam]
        assert {c.hdim for c in got} == set(kt.HEAD_DIM_TEMPLATES) and {c.dtype for c in got} == set(kt.DTYPES)
        assert {c.causal for c in got} == {False, True} and {c.heads for c in got} == set(kt.HEADS)
        assert {c.feature for c in got} == set(kt.FEATURES)
    kv = [c for c in cases if c.family == "kvcache"]
    assert {(c.paged, c.append) for c in kv} == {(p, a) for p in (False, True)
                                                 for a in ("none", "kv", "rotary", "rotary_il")}
    assert {c.num_splits for c in kv} == {0, 1, 3} and {c.seqlen_q for c in kv} == {1, 3}
    for t in kt.HEAD_DIM_TEMPLATES:  # the cache's route to the non-split kernel, where causal masking shows
        assert any(kt.kv_route(c) == "std" and c.causal and c.seqlen_q >= 2 and c.feature != "window"
                   for c in kv if c.hdim == t), t
    varlen = [c for c in cases if c.family == "varlen"]
    assert any(1 in c.lengths_q for c in varlen) and any(not c.backward for c in varlen)


def test_case_counts_and_unique_names() -> None:
    full = kt.build_cases(kt.PROFILES["sm90"], quick=False)
    assert len({c.name for c in full}) == len(full)
    counts = {f: sum(c.family == f for c in full) for f in ("base", "edge_seq", "edge_hdim", "varlen", "kvcache")}
    assert counts == {"base": 96, "edge_seq": 268, "edge_hdim": 48, "varlen": 30, "kvcache": 102}
    torch.manual_seed(0)
    assert len(kt.build_cases(kt.PROFILES["sm90"], quick=True)) <= 80


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_quick_keeps_every_seam_and_replays_from_its_seed(seed: int) -> None:
    prof = kt.PROFILES["sm90"]
    full = kt.build_cases(prof, quick=False)
    torch.manual_seed(seed)
    quick = kt.build_cases(prof, quick=True)
    names = {c.name for c in quick}
    seams = [c for c in full if kt.is_seam(c, prof)]
    assert seams and all(c.name in names for c in seams)
    for t in kt.HEAD_DIM_TEMPLATES:  # every template's first partial tile, std and split
        std = kt.fwd_tile(t, False, prof)
        assert any(c.hdim == t and c.path == "std" and c.seqlen_k == std.block_n + 1 for c in quick)
        assert any(c.hdim == t and c.path == "split" and c.seqlen_k == kt.split_tile(t).block_n + 1 for c in quick)
    torch.manual_seed(seed)
    assert [c.name for c in kt.build_cases(prof, quick=True)] == [c.name for c in quick]


def test_list_mode_runs_without_a_gpu_or_flash_attn() -> None:
    proc = subprocess.run([sys.executable, str(HERE / "kernel_tests.py"), "--list", "--profile", "sm120", "--quick"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel hdim256" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("quick (seed 0): ")


# --------------------------------------------------------------------------- a CPU stand-in kernel


class FakeFlashAttn:
    """flash_attn's three entry points on CPU, computed with the reference (fp32, then the dtype), with one
    planted fault: "causal_shift" (the causal mask one key to the right), "scale_padded" (1/sqrt of the padded
    template head dim instead of the real one), "drop_last_tile" (the keys of a partial last kBlockN tile
    ignored, kBlockN of the path the forward takes), "paged_identity" (block_table ignored), "causal_shift_std"
    (9001's kind: the causal shift in the non-split kernel only, here as flash_attn_with_kvcache reaches it)."""

    def __init__(self, profile: kt.Profile, fault: str | None = None, built: tuple[int, ...] = kt.HEAD_DIM_TEMPLATES
                 ) -> None:
        self.profile, self.fault, self.built = profile, fault, built

    def _attend(self, q, k, v, causal, window, softcap, alibi, scale, path_batch=None, std_route=False):
        d = q.shape[-1]
        if kt.head_dim_template(d) not in self.built:
            raise RuntimeError(f"FlashAttention: head dim {kt.head_dim_template(d)} was not built "
                               f"(FLASH_ATTN_HDIMS)")
        if scale is None:
            scale = (kt.head_dim_template(d) if self.fault == "scale_padded" else d) ** -0.5
        # 9001's kind: FA's causal kernel only, which a window turns into the local one (flash_api.cpp:139)
        causal_kernel = std_route and window[0] < 0
        if causal and (self.fault == "causal_shift" or (self.fault == "causal_shift_std" and causal_kernel)):
            causal, window = False, (window[0], 1)
        drop = None
        sk = k.shape[1]
        if self.fault == "drop_last_tile":
            b, sq, h = path_batch if path_batch else (q.shape[0], q.shape[1], q.shape[2])
            splits = kt.expected_splits(b, h, d, sq, sk, self.profile)
            n = kt.split_tile(d).block_n if splits > 1 else kt.fwd_tile(d, causal, self.profile).block_n
            if sk > n and sk % n:
                drop = torch.arange(sk) >= sk // n * n
        out, lse = kt.ref_attention(q.float(), k.float(), v.float(), causal=causal, window=window, softcap=softcap,
                                    alibi=alibi, scale=scale, drop_keys=drop)
        return out.to(q.dtype), torch.where(torch.isneginf(lse), math.inf, lse).detach()

    def fn(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
           alibi_slopes=None, deterministic=False, return_attn_probs=False):
        out, lse = self._attend(q, k, v, causal, window_size, softcap, alibi_slopes, softmax_scale)
        return (out, lse, None) if return_attn_probs else out

    def varlen_fn(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                  softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  deterministic=False, return_attn_probs=False, block_table=None):
        outs, lses = [], []
        for i in range(len(cu_seqlens_q) - 1):
            sq, sk = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])), slice(int(cu_seqlens_k[i]),
                                                                                  int(cu_seqlens_k[i + 1]))
            o, s = self._attend(q[None, sq], k[None, sk], v[None, sk], causal, window_size, softcap,
                                None if alibi_slopes is None else alibi_slopes[i:i + 1], softmax_scale)
            outs.append(o[0])
            lses.append(s[0])
        out, lse = torch.cat(outs), torch.cat(lses, -1)
        return (out, lse, None) if return_attn_probs else out

    def kvcache_fn(self, q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                   cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                   window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                   return_softmax_lse=False):
        b, sq = q.shape[:2]
        if block_table is not None:
            table = block_table.long()
            if self.fault == "paged_identity":
                table = torch.arange(table.numel()).view_as(table)
            kd = k_cache[table].flatten(1, 2)
            vd = v_cache[table].flatten(1, 2)
        else:
            kd, vd = k_cache, v_cache
        lens = cache_seqlens.long()
        new = 0 if k is None else k.shape[1]
        if rotary_cos is not None:
            k = kt.rotate(k, rotary_cos, rotary_sin, lens[:, None] + torch.arange(new), rotary_interleaved)
            pos = lens[:, None] + (torch.arange(sq) if causal or window_size != (-1, -1) else 0)
            q = kt.rotate(q, rotary_cos, rotary_sin, pos.expand(b, sq), rotary_interleaved)
        for i in range(b):
            if new:
                kd[i, lens[i]:lens[i] + new] = k[i]
                vd[i, lens[i]:lens[i] + new] = v[i]
        if block_table is not None and new:
            k_cache[table] = kd.view(b, -1, *k_cache.shape[1:])
            v_cache[table] = vd.view(b, -1, *v_cache.shape[1:])
        outs, lses = [], []
        for i in range(b):
            n = int(lens[i]) + new
            o, s = self._attend(q[i:i + 1], kd[i:i + 1, :n], vd[i:i + 1, :n], causal, window_size, softcap,
                                None if alibi_slopes is None else alibi_slopes[i:i + 1], softmax_scale,
                                std_route=block_table is None and k is None and num_splits == 1)
            outs.append(o)
            lses.append(s)
        out, lse = torch.cat(outs), torch.cat(lses)
        return (out, lse) if return_softmax_lse else out

    def api(self) -> kt.Api:
        api = kt.Api(self.fn, self.varlen_fn, self.kvcache_fn, self.profile, "2.8.3.post2")
        kt.probe_head_dims(api, CPU)
        return api


CPU_HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (3, 1)}  # fewer heads than the GPU's, the same head ratios' kinds


def _run(api: kt.Api, cases: list[Any]) -> dict[str, kh.CaseResult]:
    torch.manual_seed(1234)
    heads, kt.HEADS = kt.HEADS, CPU_HEADS
    try:
        return {r.name: r for r in FlashAttnCpuSuite().run_cases(api, cases, CPU)}
    finally:
        kt.HEADS = heads


class FlashAttnCpuSuite(kt.FlashAttnSuite):
    """The suite as the CPU tests drive it (run_cases / run_one with the stand-in's Api)."""


def _small(cases: list[Any], hdims: tuple[int, ...] = (32, 64, 128)) -> list[Any]:
    """The design's cases of a few head dims at CPU-friendly sizes (the lengths, which faults depend on, kept)."""
    return [c for c in cases if kt.head_dim_template(c.hdim) in hdims]


def _fwd(cases: list[Any]) -> list[Any]:
    """Forward only (the planted faults are forward faults; the backward would only double the CPU time)."""
    return [replace(c, backward=False) if isinstance(c, kt.AttnCase) else c for c in cases]


def _design(quick: bool = False) -> list[Any]:
    torch.manual_seed(0)
    return kt.build_cases(CPU_PROFILE, quick)


def test_the_unfaulted_stand_in_passes_every_family() -> None:
    cases = _small(_design(quick=True), (64, 128)) + [c for c in _design() if c.family in ("varlen", "kvcache")
                                                      and c.hdim == 64 and c.dtype == "bf16"][::2]
    results = _run(FakeFlashAttn(CPU_PROFILE).api(), cases)
    bad = {n: r.detail for n, r in results.items() if r.status != "passed"}
    assert not bad, bad
    assert {n.split("/")[0] for n in results} == {"base", "edge_seq", "edge_hdim", "varlen", "kvcache"}
    for r in results.values():
        assert r.worst is not None and r.worst < 1 and r.checks
    assert any("dq" in r.detail and "lse[empty rows] ok" in r.detail for r in results.values())
    assert any("k_cache ok" in r.detail and "rotary" in n for n, r in results.items())


def test_causal_shift_is_flagged_on_causal_cases_only() -> None:
    cases = _fwd(_small([c for c in _design() if c.family in ("base", "edge_seq") and c.path == "std"], (64,)))
    results = _run(FakeFlashAttn(CPU_PROFILE, "causal_shift").api(), cases)
    for case in cases:
        r = results[case.name]
        # one more key (i + sk - sq + 1) for every row but the last: reached by any causal case with two queries
        reachable = case.causal and case.seqlen_q >= 2
        assert (r.status == "failed") == reachable, (case.name, r.detail)
        if reachable:
            assert "out FAIL" in r.detail


def test_wrong_scale_is_flagged_exactly_where_the_head_dim_is_padded() -> None:
    """The scale of the padded template head dim is right for a template-sized head dim: only the edge_hdim
    cases that are not a template reach it, the base and boundary cases never do."""
    cases = _fwd([c for c in _design() if c.family == "edge_hdim"]
                 + _small([c for c in _design() if c.family == "base"], (32,)))
    results = _run(FakeFlashAttn(CPU_PROFILE, "scale_padded").api(), cases)
    failed = {c.hdim for c in cases if results[c.name].status == "failed"}
    assert not failed & set(kt.HEAD_DIM_TEMPLATES)  # a template-sized head dim has the right scale
    # the first head dim of each template (the most padding, scale off by 13-50 %) is always caught; a dim just
    # below its template (253 vs 256: 0.6 %) is within fp16/bf16 noise, which is why edge_hdim has the first dims
    assert failed >= {kt.edge_hdim_values(t)[0] for t in kt.HEAD_DIM_TEMPLATES} == {8, 40, 72, 104, 136, 200}


def test_dropped_last_tile_is_flagged_at_the_tile_boundaries() -> None:
    """Keys of a partial last kBlockN tile ignored: every case whose seqlen_k leaves a partial tile beyond the
    first fails (fwd, so out and the LSE), every case on a multiple of the tile (or within one tile) passes."""
    cases = _fwd(_small([c for c in _design() if c.family == "edge_seq"], (128,)))
    results = _run(FakeFlashAttn(CPU_PROFILE, "drop_last_tile").api(), cases)
    failed = {n for n, r in results.items() if r.status == "failed"}
    for case in cases:
        h, _ = CPU_HEADS[case.heads]
        b = kt.batch_for_path(case.path, h, case.hdim, case.seqlen_q, case.seqlen_k, CPU_PROFILE)
        split = kt.expected_splits(b, h, case.hdim, case.seqlen_q, case.seqlen_k, CPU_PROFILE) > 1
        n = kt.split_tile(case.hdim).block_n if split else kt.fwd_tile(case.hdim, case.causal, CPU_PROFILE).block_n
        partial = case.seqlen_k > n and case.seqlen_k % n != 0
        # a causal row sees the dropped keys only if some query reaches them
        reach = partial and (not case.causal or case.seqlen_q + (case.seqlen_k - case.seqlen_q) > case.seqlen_k // n * n)
        assert (case.name in failed) == reach, (case.name, results[case.name].detail)
    assert failed and all("out FAIL" in results[n].detail for n in failed)
    assert {r.name.split("/")[4] for r in results.values() if r.status == "passed"} >= {"k128", "k256"}


def test_paged_block_table_ignored_is_flagged_on_paged_cases_only() -> None:
    cases = [c for c in _design() if c.family == "kvcache" and c.hdim == 32 and c.dtype == "bf16"]
    results = _run(FakeFlashAttn(CPU_PROFILE, "paged_identity").api(), cases)
    assert {n for n, r in results.items() if r.status == "failed"} == {c.name for c in cases if c.paged}


def test_a_causal_shift_in_the_non_split_kernel_is_caught_through_the_cache() -> None:
    """9001's kind of fault seen from the kvcache family: only its cases on kv_route "std" reach the kernel, and
    only the causal ones with two or more queries and no window (FA's causal kernel) see the shifted mask; the
    design has one per head dim."""
    cases = [c for c in _design() if c.family == "kvcache" and c.hdim in (32, 64)]
    results = _run(FakeFlashAttn(CPU_PROFILE, "causal_shift_std").api(), cases)
    failed = {n for n, r in results.items() if r.status == "failed"}
    reach = {c.name for c in cases
             if kt.kv_route(c) == "std" and c.causal and c.seqlen_q >= 2 and c.feature != "window"}
    assert failed == reach and len(reach) >= 2, (failed, reach)


def test_head_dims_not_built_are_skipped_with_the_reason() -> None:
    api = FakeFlashAttn(CPU_PROFILE, built=(64, 128)).api()
    assert api.built == {64, 128} and set(api.not_built) == {32, 96, 192, 256}
    suite = FlashAttnCpuSuite()
    cases = _fwd([c for c in _design(quick=True) if c.family in ("base", "edge_hdim")])
    results = _run(api, cases)
    for case in cases:
        r = results[case.name]
        if kt.head_dim_template(case.hdim) in (64, 128):
            assert r.status == "passed", r.detail
        else:
            want = f"head dim {kt.head_dim_template(case.hdim)} not built into this wheel ["  # then run_cases' time
            assert r.status == "skipped" and r.detail.startswith(want), r.detail
    api.built = None  # not probed: the dispatch's own error still skips, never passes or fails
    r = suite.run_one(api, next(c for c in cases if c.hdim == 96), CPU)[0]
    assert r.status == "skipped" and r.detail.startswith("head dim 96 not built into this wheel: ")


def test_other_errors_fail_and_report_json(tmp_path: Path) -> None:
    api = FakeFlashAttn(CPU_PROFILE).api()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    api.fn = boom
    case = next(c for c in _design(quick=True) if c.family == "base")
    r = FlashAttnCpuSuite().run_one(api, case, CPU)[0]
    assert r.status == "failed" and "illegal memory access" in r.detail
    report = kt.FlashAttnSuite().new_report(3, True)
    report["cases"] = [vars(r)]
    kh.finalize(report)
    kh.write_report(report, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"
    assert kt.family_counts(report["cases"])["base"]["failed"] == 1


def test_cli_without_gpu_writes_a_skipped_report(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(HERE / "kernel_tests.py"), "--out", str(out), "--quick"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["status"] == "skipped"


def test_a_subset_wheel_says_its_head_dims_and_no_other_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """A FLASH_ATTN_HDIMS build (patch 0001) names its head dims in flash_attn_2_cuda.built_head_dims: the suite
    takes them from there and never calls another one (a call into a missing head dim crashed the process on the
    H100 before 0001 checked at the entry points), and a wheel that does not say falls back to probing."""
    import types

    api = kt.Api(lambda *a, **k: None, lambda *a, **k: None, lambda *a, **k: None, kt.PROFILES["sm90"])
    monkeypatch.setitem(sys.modules, "flash_attn_2_cuda", types.SimpleNamespace(built_head_dims=(128,)))
    assert kt.declared_head_dims(api)
    assert api.built == {128} and set(api.not_built) == set(kt.HEAD_DIM_TEMPLATES) - {128}
    case = next(c for c in kt.build_cases(api.profile, quick=True) if kt.head_dim_template(c.hdim) == 64)
    assert kt.FlashAttnSuite().skip_reason(api, case) == "head dim 64 not built into this wheel"
    monkeypatch.setitem(sys.modules, "flash_attn_2_cuda", types.SimpleNamespace())  # upstream's wheel
    assert not kt.declared_head_dims(kt.Api(None, None, None, kt.PROFILES["sm90"]))  # type: ignore[arg-type]
