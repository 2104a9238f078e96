#!/usr/bin/env python3
"""Correctness checks for an installed flash-attn (FlashAttention-2) wheel, shaped by FA2's own tiling.

Run inside a venv that holds the wheel and torch, on a machine with an NVIDIA GPU:

    python kernel_tests.py --out RESULT.json [--quick] [--no-bench] [--seed N] [--only REGEX]
    python kernel_tests.py --list [--profile sm90] [--quick]     # the case design, no GPU needed

Every kernel result is compared with this file's own fp32 attention (explicit softmax, never the package's
code), with upstream's rule from tests/test_flash_attn.py: the kernel's largest error against the fp32
reference may be at most MULT times the largest error of the same attention computed by torch in fp16/bf16
(plus a small atol): out 2x + 1e-5 (test_flash_attn_output :1121, test_flash_attn_causal :1556), dq/dk/dv
3x + 2e-4 (:1130-1132; splitkv's + 2e-4 :1853; 8x with alibi as test_flash_attn_splitkv :1852),
flash_attn_with_kvcache out 3x + 1e-5 (5x with alibi, :2139-2140), an appended k_cache allclose 1e-3
(:2137, rotary) and v_cache bitwise (:2138). The LSE (an output the backward consumes) is checked too
(2x torch's + 1e-3: ours), and an empty row's LSE must be +inf (FA's convention, softmax.h:180).

Families (each case's name starts with its family; --only '^edge_' runs the boundary ones):

* base        flash_attn_func fwd + bwd: fp16/bf16 x every head dim template x causal x feature (none, sliding
              window, softcap, alibi) in full, heads (MHA, GQA, MQA), length pairs, the std or split-kv forward
              path and deterministic backward pairwise.
* edge_seq    seqlen_q / seqlen_k at and around each head dim's kBlockM / kBlockN of the forward, the
              backward and the split-kv forward ON THIS GPU (the launch templates pick tiles per arch and
              shared memory): kh.boundary_values of each tile, q and k lengths unequal, 1, odd, and the even
              (Is_even_MN) multiples; causal and not; fwd + bwd.
* edge_hdim   head dims around each template (HEADDIM_SWITCH): the first dim a template serves (Is_even_K
              false, most padding), template - 8, template - 3 (the Python side pads to a multiple of 8),
              the template itself.
* varlen      flash_attn_varlen_func with cu_seqlens: packed sequences whose ends fall at, before and after
              the tiles, length-1 sequences, q and k lengths differing; fwd + bwd; plus varlen decode
              (max_seqlen_q 1 with GQA: the seqlenq_ngroups_swapped split-kv path).
* kvcache     flash_attn_with_kvcache decode / short prefill: cache_seqlens around the split-kv kBlockN,
              dense and paged caches (block_table, page_block_size 256: the only sizes 2.8.x accepts),
              appending k/v (with rotary, interleaved and not), num_splits heuristic / 1 / forced.

A head dim template the wheel was built without (a FLASH_ATTN_HDIMS build) is detected by a tiny call per
template; its cases are reported `skipped: head dim N not built into this wheel`, never passed. Dropout is not
checked (its mask cannot be replayed by a reference). Exit code: 0 passed, 1 failed, 3 skipped.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

try:
    import kernel_harness as kh  # on PYTHONPATH when the builder runs the suite
except ImportError:  # run in place from a checkout or an unpacked recipes/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "_harness"))
    import kernel_harness as kh

PACKAGE = "flash-attn"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# --------------------------------------------------------------------------- tolerances (tests/test_flash_attn.py)
OUT_MULT, OUT_ATOL = 2.0, 1e-5  # :1121, :1556 ("<= 2 * (out_pt - out_ref) ... + 1e-5")
GRAD_MULT, GRAD_MULT_ALIBI, GRAD_ATOL = 3.0, 8.0, 2e-4  # :1130-1132 (3x); :1852-1855 (mult 8 with alibi, + 2e-4)
KV_OUT_MULT, KV_OUT_MULT_ALIBI = 3.0, 5.0  # :2139-2140 (test_flash_attn_kvcache)
KCACHE_TOL = 1e-3  # :2137 allclose(k_cache_select, k_cache_ref, rtol=1e-3, atol=1e-3); v_cache: torch.equal :2138
LSE_MULT, LSE_ATOL = 2.0, 1e-3  # ours: upstream's tests do not compare the LSE
SOFTCAP = 1.5  # ours: upstream uses 50, which barely bends N(0, 1) scores; 1.5 makes tanh matter
ALIBI_MAX = 0.3  # :599 alibi_slopes = torch.rand(batch_size, nheads) * 0.3

# --------------------------------------------------------------------------- tiling facts (upstream's source)
# Read from the flash_attn-2.8.3.post2 sdist; paths under csrc/flash_attn/ (src/ unless named). The forward picks
# (kBlockM, kBlockN) per head dim template, causal, dropout, arch (is_sm8x = cc 8.x with minor > 0) and shared
# memory; the backward per head dim and shared memory per block; split-kv has its own tiles. Every boundary case
# below is derived from these functions and a device profile (the GPU's compute capability, shared memory and
# SM count), nothing else. Dropout is not tested, so only the no-dropout tiles are declared.
FWD_SRC = "csrc/flash_attn/src/flash_fwd_launch_template.h"
BWD_SRC = "csrc/flash_attn/src/flash_bwd_launch_template.h"
API_SRC = "csrc/flash_attn/flash_api.cpp"
HEAD_DIM_TEMPLATES = (32, 64, 96, 128, 192, 256)  # static_switch.h:90-111 HEADDIM_SWITCH (<= 32, <= 64, ... <= 256)
HEAD_DIM_SRC = ("csrc/flash_attn/src/static_switch.h:90-111 HEADDIM_SWITCH; flash_api.cpp:393-394 head_size <= 256, "
                "% 8 == 0; flash_attn/flash_attn_interface.py:830-833 pads q/k/v to a multiple of 8")
SPLIT_BLOCK_M = 64  # flash_fwd_launch_template.h:165 "constexpr static int kBlockM = 64;  // Fixed for all head dims"
PAGE_BLOCK = 256  # flash_api.cpp:1264 (mha_fwd_kvcache) and :583 "Paged KV cache block size must be divisible by 256"
SPLIT_MAX = 128  # flash_api.cpp:317 num_splits_heuristic(..., 128); :325 "num_splits > 128 not supported"


@dataclass(frozen=True)
class Profile:
    """What FA's launch code reads from the device: compute capability, shared memory (opt-in per block, per
    SM: cudaDevAttrMaxSharedMemoryPerBlockOptin / PerMultiprocessor) and SMs (get_num_sm, for num_splits)."""

    name: str
    major: int
    minor: int
    smem_block: int
    smem_sm: int
    sms: int

    @property
    def is_sm8x(self) -> bool:  # flash_fwd_launch_template.h:204 "is_sm8x = cc_major == 8 && cc_minor > 0"
        return self.major == 8 and self.minor > 0


KIB = 1024
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("sm80", 8, 0, 163 * KIB, 164 * KIB, 108),  # A100
    Profile("sm86", 8, 6, 99 * KIB, 100 * KIB, 84),  # RTX 3090 / A6000
    Profile("sm89", 8, 9, 99 * KIB, 100 * KIB, 128),  # RTX 4090 / L40S
    Profile("sm90", 9, 0, 227 * KIB, 228 * KIB, 132),  # H100 SXM (H200: the same)
    Profile("sm100", 10, 0, 227 * KIB, 228 * KIB, 148),  # B200
    Profile("sm120", 12, 0, 99 * KIB, 100 * KIB, 170),  # RTX 5090
    Profile("sm121", 12, 1, 99 * KIB, 100 * KIB, 48),  # DGX Spark GB10
)}


def device_profile(device: torch.device) -> Profile:
    """The running GPU's profile; shared memory from torch's properties where it has them, else the table's."""
    props = torch.cuda.get_device_properties(device)
    major, minor = props.major, props.minor
    known = next((p for p in PROFILES.values() if (p.major, p.minor) == (major, minor)), None)
    block = getattr(props, "shared_memory_per_block_optin", None) or (known.smem_block if known else 99 * KIB)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", None) or (known.smem_sm if known else 100 * KIB)
    return Profile(f"sm{major}{minor}", major, minor, int(block), int(per_sm), int(props.multi_processor_count))


@dataclass(frozen=True)
class Tile:
    """One kernel's (kBlockM, kBlockN) and where upstream says so."""

    kernel: str
    block_m: int
    block_n: int
    source: str

    def tilings(self) -> tuple[kh.Tiling, kh.Tiling]:
        return (kh.Tiling(self.kernel, "seqlen_q", self.block_m, 1, self.source),
                kh.Tiling(self.kernel, "seqlen_k", self.block_n, 1, self.source))


def head_dim_template(d: int) -> int:
    """The kHeadDim that serves head dim d: the Python side pads d to a multiple of 8, HEADDIM_SWITCH rounds up."""
    padded = (d + 7) // 8 * 8
    return next(t for t in HEAD_DIM_TEMPLATES if padded <= t)


def fwd_tile(hdim: int, causal: bool, prof: Profile) -> Tile:
    """run_mha_fwd_hdim* without dropout (flash_fwd_launch_template.h)."""
    t = head_dim_template(hdim)
    name = f"flash_fwd_kernel hdim{t}"
    if t in (32, 64):
        return Tile(name, 128, 128, f"{FWD_SRC}:{176 if t == 32 else 188}")
    if t == 96:
        if prof.is_sm8x:
            return (Tile(name, 64, 64, f"{FWD_SRC}:211 (sm8x, causal)") if causal
                    else Tile(name, 128, 64, f"{FWD_SRC}:209 (sm8x)"))
        return Tile(name, 128, 64, f"{FWD_SRC}:214")
    if t == 128:
        if prof.is_sm8x:
            return (Tile(name, 64, 64, f"{FWD_SRC}:237 (sm8x, causal)") if causal
                    else Tile(name, 128, 32, f"{FWD_SRC}:235 (sm8x)"))
        return Tile(name, 128, 64, f"{FWD_SRC}:240")
    if t == 192:
        return Tile(name, 128, 64, f"{FWD_SRC}:264")
    big = prof.smem_block >= 2 * 256 * (128 + 2 * 64) and prof.smem_sm < 4 * 256 * (64 + 2 * 64)
    return (Tile(name, 128, 64, f"{FWD_SRC}:293-294 (A100-class smem)") if big
            else Tile(name, 64, 64, f"{FWD_SRC}:293,296 (H100 / 99 KB-class smem)"))


def bwd_tile(hdim: int, prof: Profile) -> Tile:
    """run_mha_bwd_hdim* (flash_bwd_launch_template.h): by max shared memory per block."""
    t = head_dim_template(hdim)
    name = f"flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel hdim{t}"
    smem = prof.smem_block
    if t == 32:
        return Tile(name, 128, 128, f"{BWD_SRC}:147-154")
    if t == 64:
        return (Tile(name, 128, 128, f"{BWD_SRC}:178-179 (>= 144 KB)") if smem >= 144 * KIB
                else Tile(name, 64, 128, f"{BWD_SRC}:185"))
    if t == 96:
        return Tile(name, 64, 128, f"{BWD_SRC}:217-225")
    if t == 128:
        return (Tile(name, 64, 128, f"{BWD_SRC}:247-248 (>= 144 KB)") if smem >= 144 * KIB
                else Tile(name, 64, 64, f"{BWD_SRC}:256"))
    if t == 192:
        return Tile(name, 64, 64, f"{BWD_SRC}:276-279")
    if smem >= 144 * KIB:
        return Tile(name, 64, 64, f"{BWD_SRC}:296-299 (>= 144 KB)")
    return Tile(name, 64, 32, f"{BWD_SRC}:300-302 (99 KB-class smem)")


def split_tile(hdim: int) -> Tile:
    """run_mha_fwd_splitkv_dispatch: kBlockM 64, kBlockN 256 / 128 / 64 (also set_params_splitkv's block_n)."""
    t = head_dim_template(hdim)
    n = 256 if t <= 64 else (128 if t <= 128 else 64)
    return Tile(f"flash_fwd_splitkv_kernel hdim{t}", SPLIT_BLOCK_M, n,
                f"{FWD_SRC}:165,168; {API_SRC}:305 block_n")


def tilings(prof: Profile) -> list[kh.Tiling]:
    """Every tiling fact the boundary cases derive from, for one device profile."""
    facts: list[kh.Tiling] = []
    for t in HEAD_DIM_TEMPLATES:
        tiles = {fwd_tile(t, False, prof), fwd_tile(t, True, prof), bwd_tile(t, prof), split_tile(t)}
        for tile in sorted(tiles, key=lambda x: (x.kernel, x.source)):
            facts += tile.tilings()
        facts.append(kh.Tiling(f"HEADDIM_SWITCH kHeadDim {t}", "headdim", t, 8, HEAD_DIM_SRC))
    return facts


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """flash_api.cpp:263-297, line by line (num_sms is already 2 x SMs, as set_params_splitkv passes it)."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    ceildiv = lambda a, b: (a + b - 1) // b  # noqa: E731
    eligible = [s == 1 or ceildiv(num_n_blocks, s) != ceildiv(num_n_blocks, s - 1) for s in range(1, max_splits + 1)]
    eff = []
    for s in range(1, max_splits + 1):
        waves = batch_nheads_mblocks * s / num_sms
        eff.append(waves / math.ceil(waves) if eligible[s - 1] else 0.0)
    best = max(eff, default=0.0)
    for s in range(1, max_splits + 1):
        if eligible[s - 1] and eff[s - 1] >= 0.85 * best:
            return s
    return 1


def expected_splits(batch: int, heads: int, hdim: int, seqlen_q: int, seqlen_k: int, prof: Profile) -> int:
    """set_params_splitkv (flash_api.cpp:299-327) with num_splits 0: what mha_fwd (and decode) will run."""
    n_blocks = -(-seqlen_k // split_tile(hdim).block_n)
    m_blocks = -(-seqlen_q // SPLIT_BLOCK_M)
    return num_splits_heuristic(batch * heads * m_blocks, prof.sms * 2, n_blocks, SPLIT_MAX)


def batch_for_path(path: str, heads: int, hdim: int, seqlen_q: int, seqlen_k: int, prof: Profile) -> int:
    """The batch that puts flash_attn_func's forward on the wanted path: "split" (batch 1: few blocks, the
    heuristic splits seqlen_k), "std" (enough batch x heads x m-blocks to fill 0.8 x 2 x SMs: one split)."""
    if path == "split":
        return 1
    m_blocks = -(-seqlen_q // SPLIT_BLOCK_M)
    if expected_splits(1, heads, hdim, seqlen_q, seqlen_k, prof) == 1:
        return 1
    return max(1, math.ceil(0.8 * 2 * prof.sms / (heads * m_blocks)))


# --------------------------------------------------------------------------- references


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  window: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi: torch.Tensor | None = None,
                  scale: float | None = None, upcast: bool = True, drop_keys: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with an explicit softmax, differentiable; FA's conventions (flash_attn_interface.py docstrings).

    q (b, sq, h, d), k and v (b, sk, hk, d), h % hk == 0: query head i uses kv head i // (h // hk). Query row i
    sits at key position i + sk - sq (the bottom-right aligned mask): causal keeps keys j <= i + sk - sq; a
    window (left, right) keeps i + sk - sq - left <= j <= i + sk - sq + right (-1: unbounded). Logits:
    softcap * tanh(scale q.k / softcap) (softcap > 0), then - alibi[b, h] * |i + sk - sq - j| (alibi (h,) or
    (b, h)). A row with no key left outputs 0 and has LSE -inf. upcast: compute in fp32 (the reference), else in
    q's dtype with k scaled instead of q (upstream's out_pt, reorder_ops=True). Returns (out (b, sq, h, d) in the
    compute dtype, lse (b, h, sq) fp32). drop_keys (sk,) bool: keys masked on top (the CPU tests' planted faults).
    """
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    if upcast:
        scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    else:
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k * scale)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    row = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    col = torch.arange(sk, device=q.device)[None, :]
    masked = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        right = 0
    if right >= 0:
        masked |= col > row + right
    if left >= 0:
        masked |= col < row - left
    if drop_keys is not None:
        masked |= drop_keys[None, :]
    if alibi is not None:
        slopes = alibi.float().reshape(-1 if alibi.dim() == 2 else 1, h)[:, :, None, None]
        scores = scores - (slopes * (row - col).abs().float()).to(scores.dtype)
    scores = scores.masked_fill(masked, float("-inf"))
    peak = scores.detach().amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    lse = (peak.float() + total.float().log()).squeeze(-1)
    if alibi is not None and right == 0 and (left < 0 or left >= sk):
        # FA's LSE convention for causal alibi (found by the GPU run of session 19: LSE off by up to 72 on every
        # causal alibi case, out and grads within tolerance). Causal attention (flash_api.cpp: is_causal =
        # window_size_left < 0 && window_size_right == 0) adds + slope * j to each logit (csrc/flash_attn/src/
        # mask.h:180-182, alibi.h:39 "we add the same bias vector to all rows"), not - slope * |i + sk - sq - j|.
        # On the keys a causal row keeps the two differ by slope * (i + sk - sq), a per-row constant: softmax, out
        # and grads are unchanged and softmax_lse is higher by it (the backward reads it back the same way).
        lse = lse + slopes[..., 0] * row[:, 0].float()
    return out, lse


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
           ) -> torch.Tensor:
    """Rotary embedding of x (b, s, h, d) at integer positions (b, s), computed in fp32, returned in x's dtype:
    flash_attn/layers/rotary.py apply_rotary_emb_torch (interleaved: pairs 0&1, 2&3; else 0 & rd/2)."""
    rd = cos.shape[-1] * 2
    c, s = cos.float()[positions.long()], sin.float()[positions.long()]  # (b, s, rd / 2)
    c = (c.repeat_interleave(2, -1) if interleaved else torch.cat([c, c], -1))[:, :, None, :]
    s = (s.repeat_interleave(2, -1) if interleaved else torch.cat([s, s], -1))[:, :, None, :]
    xr = x[..., :rd].float()
    if interleaved:
        half = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, dim=-1)
        half = torch.cat((-x2, x1), dim=-1)
    return torch.cat([(xr * c + half * s).to(x.dtype), x[..., rd:]], dim=-1)


# --------------------------------------------------------------------------- the package under test


@dataclass
class Api:
    """The package's three entry points, the device profile and which head dim templates the wheel carries."""

    fn: Callable[..., Any]
    varlen_fn: Callable[..., Any]
    kvcache_fn: Callable[..., Any]
    profile: Profile
    version: str | None = None
    built: set[int] | None = None  # head dim templates that run; None: not probed yet
    not_built: dict[int, str] = field(default_factory=dict)  # template -> the wheel's words


# A head dim template missing from the wheel (FLASH_ATTN_HDIMS builds): the dispatch's error. Anything else a
# probe raises counts the template as built, so a real failure shows in its cases instead of being skipped.
NOT_BUILT = re.compile(r"not (been )?(built|compiled|included)|built without|FLASH_ATTN_HDIMS|no kernels? for "
                       r"(head ?dim|hdim)", re.IGNORECASE)


def declared_head_dims(api: Api) -> bool:
    """The head dim templates the wheel says it has (``flash_attn_2_cuda.built_head_dims``, which the farm's patch
    0001 adds): no call into a template the wheel lacks. False where the wheel does not say (upstream's build:
    ``probe_head_dims`` asks each template)."""
    try:
        import flash_attn_2_cuda
    except ImportError:
        return False
    said = getattr(flash_attn_2_cuda, "built_head_dims", None)
    if said is None:
        return False
    api.built = {int(d) for d in said}
    api.not_built = {t: f"not in flash_attn_2_cuda.built_head_dims {tuple(sorted(api.built))} (FLASH_ATTN_HDIMS)"
                     for t in HEAD_DIM_TEMPLATES if t not in api.built}
    return True


def probe_head_dims(api: Api, device: torch.device) -> None:
    """One tiny forward per head dim template: which ones this wheel was built with."""
    api.built, api.not_built = set(), {}
    for t in HEAD_DIM_TEMPLATES:
        q = torch.randn(1, 3, 2, t, dtype=torch.float16, device=device)
        try:
            api.fn(q, q, q)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001  (classified just below)
            if NOT_BUILT.search(str(exc)):
                api.not_built[t] = kh.short_error(exc)
                continue
        api.built.add(t)


def not_built_reason(hdim: int) -> str:
    return f"head dim {head_dim_template(hdim)} not built into this wheel"


# --------------------------------------------------------------------------- case design

HEADS = {"mha": (4, 4), "gqa": (6, 2), "mqa": (4, 1)}
FEATURES = ("none", "window", "softcap", "alibi")


@dataclass(frozen=True)
class AttnCase:
    """flash_attn_func forward (and backward): one shape, one path, one feature."""

    family: str
    dtype: str
    hdim: int
    causal: bool
    heads: str
    seqlen_q: int
    seqlen_k: int
    path: str = "std"  # "std" (flash_fwd_kernel) or "split" (flash_fwd_splitkv_kernel + combine)
    feature: str = "none"
    deterministic: bool = False
    backward: bool = True

    @property
    def name(self) -> str:
        parts = [self.family, self.dtype, f"d{self.hdim}", f"q{self.seqlen_q}", f"k{self.seqlen_k}",
                 "causal" if self.causal else "full", self.heads, self.path]
        if self.feature != "none":
            parts.append(self.feature)
        if self.deterministic:
            parts.append("det")
        if not self.backward:
            parts.append("fwd-only")
        return "/".join(parts)


@dataclass(frozen=True)
class VarlenCase:
    """flash_attn_varlen_func over packed sequences (q and k lengths per sequence)."""

    family: str
    dtype: str
    hdim: int
    causal: bool
    heads: str
    lengths_q: tuple[int, ...]
    lengths_k: tuple[int, ...]
    feature: str = "none"
    backward: bool = True

    @property
    def name(self) -> str:
        lq, lk = "-".join(map(str, self.lengths_q)), "-".join(map(str, self.lengths_k))
        parts = [self.family, self.dtype, f"d{self.hdim}", f"q{lq}", f"k{lk}",
                 "causal" if self.causal else "full", self.heads]
        if self.feature != "none":
            parts.append(self.feature)
        return "/".join(parts)


@dataclass(frozen=True)
class KVCase:
    """flash_attn_with_kvcache: q of seqlen_q tokens against a cache holding cache_seqlens[b] tokens (plus the
    appended ones), dense or paged."""

    family: str
    dtype: str
    hdim: int
    causal: bool
    heads: str
    seqlen_q: int
    cache_seqlens: tuple[int, ...]
    paged: bool
    append: str = "none"  # "none", "kv" (k/v appended), "rotary" (appended with rotary), "rotary_il" (interleaved)
    num_splits: int = 0
    feature: str = "none"

    @property
    def name(self) -> str:
        parts = [self.family, self.dtype, f"d{self.hdim}", f"q{self.seqlen_q}",
                 "c" + "-".join(map(str, self.cache_seqlens)), "paged" if self.paged else "dense",
                 "causal" if self.causal else "full", self.heads, f"append-{self.append}", f"splits{self.num_splits}"]
        if self.feature != "none":
            parts.append(self.feature)
        return "/".join(parts)


Case = AttnCase | VarlenCase | KVCase


def _seq_pairs(hdim: int, prof: Profile) -> list[tuple[int, int]]:
    """Sampled (seqlen_q, seqlen_k) pairs for the base family: unequal, odd, 1, longer than one tile."""
    n = fwd_tile(hdim, False, prof).block_n
    return [(113, 203), (1, 239), (277, 96), (2 * n + 17, 3 * n - 5), (64, 64), (511, 301)]


def base_cases(prof: Profile, templates: Sequence[int]) -> list[AttnCase]:
    """dtype x head dim x causal x feature in full; heads, lengths, path, deterministic pairwise."""
    pairs = {t: _seq_pairs(t, prof) for t in templates}
    levels = {"dtype": list(DTYPES), "hdim": list(templates), "causal": [False, True], "feature": list(FEATURES),
              "heads": list(HEADS), "pair": list(range(6)), "path": ["std", "split"], "det": [False, True]}
    cases = []
    for row in kh.covering_rows(levels, ["dtype", "hdim", "causal", "feature"]):
        sq, sk = pairs[row["hdim"]][row["pair"]]
        cases.append(AttnCase("base", row["dtype"], row["hdim"], row["causal"], row["heads"], sq, sk, row["path"],
                              row["feature"], row["det"]))
    return cases


def edge_lengths(hdim: int, prof: Profile, path: str) -> tuple[list[int], list[int]]:
    """The boundary seqlen_q and seqlen_k values of one head dim's kernels on this device: every tile's
    kh.boundary_values (k * block + {0, 1, 2, block - 1}, k <= 2). "std": the forward (causal and not) and the
    backward tiles; "split": the split-kv tiles, seqlen_k above one block (below it nothing is split)."""
    if path == "split":
        tile = split_tile(hdim)
        qs = kh.boundary_values(tile.block_m, chunks=1)
        ks = [n for n in kh.boundary_values(tile.block_n, chunks=2) if n > tile.block_n]
        return qs, ks
    tiles = [fwd_tile(hdim, False, prof), fwd_tile(hdim, True, prof), bwd_tile(hdim, prof)]
    qs = sorted({n for t in tiles for n in kh.boundary_values(t.block_m, chunks=2)})
    ks = sorted({n for t in tiles for n in kh.boundary_values(t.block_n, chunks=2)})
    return qs, ks


def edge_seq_cases(prof: Profile, templates: Sequence[int]) -> list[AttnCase]:
    """Per head dim template and path: every boundary seqlen_q met by a boundary seqlen_k in reverse order
    (short q with long k and the reverse: unequal lengths, causal rows with no key), causal and not, plus the
    even multiples of the forward tile (Is_even_MN); dtype and heads rotate. Forward and backward."""
    cases: list[AttnCase] = []
    heads = list(HEADS)
    for t in templates:
        for path in ("std", "split"):
            qs, ks = edge_lengths(t, prof, path)
            pairs = [(qs[i % len(qs)], ks[::-1][i % len(ks)]) for i in range(max(len(qs), len(ks)))]
            if path == "std":
                for causal in (False, True):
                    tile = fwd_tile(t, causal, prof)
                    pairs += [(tile.block_m, tile.block_n), (2 * tile.block_m, 2 * tile.block_n)]
            seen: set[tuple[int, int, bool]] = set()
            for i, (sq, sk) in enumerate(pairs):
                for causal in (False, True):
                    if (sq, sk, causal) in seen:
                        continue
                    seen.add((sq, sk, causal))
                    cases.append(AttnCase("edge_seq", list(DTYPES)[(i + causal) % 2], t, causal,
                                          heads[(i + t // 32) % 3], sq, sk, path))
    return cases


def edge_hdim_values(template: int) -> list[int]:
    """The head dims one template serves, at its edges: the first (previous template + 8: most padding, Is_even_K
    false), template - 8, template - 3 (not a multiple of 8: padded in Python), the template itself."""
    prev = HEAD_DIM_TEMPLATES[HEAD_DIM_TEMPLATES.index(template) - 1] if template != HEAD_DIM_TEMPLATES[0] else 0
    return sorted({prev + 8, template - 8, template - 3, template})


def edge_hdim_cases(prof: Profile, templates: Sequence[int]) -> list[AttnCase]:
    cases = []
    for t in templates:
        for i, d in enumerate(edge_hdim_values(t)):
            tile = fwd_tile(d, True, prof)
            for causal in (False, True):
                cases.append(AttnCase("edge_hdim", list(DTYPES)[(i + causal) % 2], d, causal,
                                      list(HEADS)[i % 3], tile.block_m + 1, tile.block_n + 3,
                                      "std" if causal else "split"))
    return cases


def varlen_lengths(hdim: int, prof: Profile, variant: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Packed sequence lengths whose ends fall at, one before and one after the forward and backward tiles
    (the varlen kernels never take the even path: flash_fwd_launch_template.h:65), with length-1 sequences and
    q shorter or longer than k per sequence."""
    m, n = fwd_tile(hdim, False, prof).block_m, fwd_tile(hdim, False, prof).block_n
    bm, bn = bwd_tile(hdim, prof).block_m, bwd_tile(hdim, prof).block_n
    if variant == 0:
        return (m + 1, 1, m - 1, 2 * m), (n - 1, n + 1, 1, 2 * n + 1)
    return (bm - 1, bm + 1, 3, 1), (bn + 1, bn, 2 * bn - 1, 1)


def varlen_cases(prof: Profile, templates: Sequence[int]) -> list[VarlenCase]:
    levels = {"dtype": list(DTYPES), "hdim": list(templates), "causal": [False, True], "heads": list(HEADS),
              "feature": list(FEATURES), "variant": [0, 1]}
    cases = []
    for row in kh.covering_rows(levels, ["dtype", "hdim", "causal"]):
        lq, lk = varlen_lengths(row["hdim"], prof, row["variant"])
        cases.append(VarlenCase("varlen", row["dtype"], row["hdim"], row["causal"], row["heads"], lq, lk,
                                row["feature"]))
    for i, t in enumerate(templates):  # decode: max_seqlen_q 1 with GQA / MQA (seqlenq_ngroups_swapped, split-kv)
        n = split_tile(t).block_n
        cases.append(VarlenCase("varlen", list(DTYPES)[i % 2], t, False, ("gqa", "mqa")[i % 2], (1, 1, 1),
                                (n + 1, 2 * n - 1, 1), backward=False))
    return cases


def kv_seqlens(hdim: int, variant: int) -> tuple[int, ...]:
    """cache_seqlens around the split-kv kBlockN (a partial last block, one key in a new block) and the page size."""
    n = split_tile(hdim).block_n
    return ((n - 1, n + 1, 1), (2 * n + 1, PAGE_BLOCK - 1, PAGE_BLOCK + 1))[variant]


def kvcache_cases(prof: Profile, templates: Sequence[int]) -> list[KVCase]:
    levels = {"dtype": list(DTYPES), "paged": [False, True], "append": ["none", "kv", "rotary", "rotary_il"],
              "hdim": list(templates), "causal": [False, True], "heads": list(HEADS), "seqlen_q": [1, 3],
              "num_splits": [0, 1, 3], "feature": list(FEATURES), "variant": [0, 1]}
    cases = []
    for row in kh.covering_rows(levels, ["dtype", "paged", "append", "hdim"]):
        hdim, variant = row.pop("hdim"), row.pop("variant")
        cases.append(KVCase("kvcache", hdim=hdim, cache_seqlens=kv_seqlens(hdim, variant), **row))
    # The non-split forward kernel is reached from the cache only by kv_route's "std" (a dense cache, nothing
    # appended, one split), and its causal mask only with two or more queries and no window (a window makes
    # params.is_causal false, flash_api.cpp:139: the local mask instead); the covering rows leave that to chance
    # (none of them had it, and the 9001 fault went unseen by this family), so every head dim gets it.
    for i, hdim in enumerate(templates):
        cases.append(KVCase("kvcache", dtype=list(DTYPES)[i % 2], hdim=hdim, causal=True,
                            heads=list(HEADS)[i % len(HEADS)], seqlen_q=3, cache_seqlens=kv_seqlens(hdim, i % 2),
                            paged=False, append="none", num_splits=1, feature=("none", "softcap")[i % 2]))
    return cases


def kv_route(case: KVCase) -> str:
    """The kernel flash_attn_with_kvcache runs: "split" (flash_fwd_splitkv_kernel) when flash_api.cpp:1457 forces
    it (k/v appended, cache_batch_idx or a paged cache) or num_splits > 1; "std" (compute_attn_1rowblock, the
    kernel flash_attn_func runs) with num_splits 1 (:247); "heuristic" with num_splits 0 (set_params_splitkv's
    choice, :299-327, which depends on the GPU's SM count)."""
    if case.paged or case.append != "none" or case.num_splits > 1:
        return "split"
    return "std" if case.num_splits == 1 else "heuristic"


def is_seam(case: Case, prof: Profile) -> bool:
    """What --quick never drops: a sequence one past the first tile of the kernel the case runs (a partial
    second tile: the masking seam), the head dim with the most padding per template, and a paged, rotary or
    several-sequence batch per family."""
    if isinstance(case, AttnCase):
        if case.family == "edge_seq":
            tile = split_tile(case.hdim) if case.path == "split" else fwd_tile(case.hdim, case.causal, prof)
            return case.seqlen_k == tile.block_n + 1 or (case.path == "std" and case.seqlen_q == tile.block_m + 1)
        if case.family == "edge_hdim":
            t = head_dim_template(case.hdim)
            return case.hdim == edge_hdim_values(t)[0] and case.causal
        return False
    if isinstance(case, VarlenCase):
        return case.backward and case.hdim == 128 and not case.causal and case.dtype == "bf16"
    return case.paged and case.append == "rotary" and case.hdim == 128


def build_cases(prof: Profile, quick: bool, templates: Sequence[int] = HEAD_DIM_TEMPLATES) -> list[Case]:
    """The run's cases for one device profile (about 600 full, about 70 with --quick)."""
    families: list[tuple[list[Any], int]] = [  # (cases, quick size)
        (base_cases(prof, templates), 10), (edge_seq_cases(prof, templates), 30),
        (edge_hdim_cases(prof, templates), 8), (varlen_cases(prof, templates), 6),
        (kvcache_cases(prof, templates), 8)]
    if not quick:
        return [c for cases, _ in families for c in cases]
    return [c for cases, n in families for c in kh.seeded_sample(cases, n, keep=lambda c: is_seam(c, prof))]


# --------------------------------------------------------------------------- comparisons


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over the elements where both are finite (0 for none)."""
    a32, b32 = a.detach().float(), b.detach().float()
    ok = torch.isfinite(a32) & torch.isfinite(b32)
    return (a32 - b32)[ok].abs().max().item() if bool(ok.any()) else 0.0


def check_vs_torch(label: str, got: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor, mult: float, atol: float
                   ) -> kh.Check:
    """Upstream's rule: max |got - ref| <= mult * max |pt - ref| + atol, ref in fp32, pt the same attention in the
    kernel's dtype by torch. As a check_close with rtol 0, so `worst` is the error over its bound."""
    pt_err = max_err(pt, ref)
    check = kh.check_close(label, got, ref, 0.0, mult * pt_err + atol)
    check.note = " ".join(filter(None, [check.note, f"[{mult:g} x torch {str(pt.dtype)[6:]} err {pt_err:.3g} + {atol:g}]"]))
    return check


def check_lse(label: str, got: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor) -> list[kh.Check]:
    """Rows with keys: close to the fp32 LSE (2 x torch's error + 1e-3); rows without any key: +inf (FA's value for
    an empty row, softmax.h:180 / flash_fwd_kernel.h:1195)."""
    if tuple(got.shape) != tuple(ref.shape):
        return [kh.Check(label, False, None, note=f"shape {tuple(got.shape)} != {tuple(ref.shape)}")]
    rows = torch.isfinite(ref)
    checks = [check_vs_torch(label, got[rows], ref[rows], pt[rows], LSE_MULT, LSE_ATOL)]
    if not bool(rows.all()):
        empty = got[~rows]
        ok = bool((empty == math.inf).all())
        checks.append(kh.Check(f"{label}[empty rows]", ok, None,
                               note="" if ok else f"{int((empty != math.inf).sum())}/{empty.numel()} not +inf"))
    return checks


def grad_checks(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor], ref_outs: Sequence[torch.Tensor],
                ref_leaves: Sequence[torch.Tensor], pt_outs: Sequence[torch.Tensor], pt_leaves: Sequence[torch.Tensor],
                mult: float) -> list[kh.Check]:
    """dq, dk, dv of the kernel, the fp32 reference and torch in the kernel's dtype, for one random cotangent."""
    grad_out = [torch.randn_like(o) for o in outs]
    got = torch.autograd.grad(outs, leaves, grad_out)
    ref = torch.autograd.grad(ref_outs, ref_leaves, [g.float() for g in grad_out])
    pt = torch.autograd.grad(pt_outs, pt_leaves, grad_out)
    return [check_vs_torch(name, g, r, p, mult, GRAD_ATOL) for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt,
                                                                                      strict=True)]


def _window(case: Case, seqlen_k: int) -> tuple[int, int]:
    """A sliding window that crosses tiles: left a third of the keys (at least one), right 5 (0 when causal)."""
    return (max(1, seqlen_k // 3), 5) if case.feature == "window" else (-1, -1)


def _alibi(case: Case, batch: int, heads: int, device: torch.device) -> torch.Tensor | None:
    return torch.rand(batch, heads, device=device) * ALIBI_MAX if case.feature == "alibi" else None


def _leaves(*tensors: torch.Tensor, upcast: bool) -> list[torch.Tensor]:
    return [(t.detach().float() if upcast else t.detach().clone()).requires_grad_(t.requires_grad) for t in tensors]


# --------------------------------------------------------------------------- case runners


def run_attn_case(api: Api, case: AttnCase, device: torch.device) -> kh.CaseResult:
    """flash_attn_func fwd (+ bwd) against ref_attention in fp32, bounded by torch's own error in the dtype."""
    h, hk = HEADS[case.heads]
    sq, sk, d = case.seqlen_q, case.seqlen_k, case.hdim
    batch = batch_for_path(case.path, h, d, sq, sk, api.profile)
    dtype = DTYPES[case.dtype]
    q = torch.randn(batch, sq, h, d, dtype=dtype, device=device).requires_grad_(case.backward)
    k = torch.randn(batch, sk, hk, d, dtype=dtype, device=device).requires_grad_(case.backward)
    v = torch.randn(batch, sk, hk, d, dtype=dtype, device=device).requires_grad_(case.backward)
    window, alibi = _window(case, sk), _alibi(case, batch, h, device)
    softcap = SOFTCAP if case.feature == "softcap" else 0.0
    opts: dict[str, Any] = dict(causal=case.causal, window=window, softcap=softcap, alibi=alibi)
    kh.poison_allocator(kh.nbytes(q, k, v), device)
    out, lse, _ = api.fn(q, k, v, causal=case.causal, window_size=window, softcap=softcap, alibi_slopes=alibi,
                         deterministic=case.deterministic, return_attn_probs=True)
    ref_leaves, pt_leaves = _leaves(q, k, v, upcast=True), _leaves(q, k, v, upcast=False)
    out_ref, lse_ref = ref_attention(*ref_leaves, **opts)
    out_pt, lse_pt = ref_attention(*pt_leaves, upcast=False, **opts)
    checks = [check_vs_torch("out", out, out_ref, out_pt, OUT_MULT, OUT_ATOL), *check_lse("lse", lse, lse_ref, lse_pt)]
    if case.backward:
        mult = GRAD_MULT_ALIBI if alibi is not None else GRAD_MULT
        checks += grad_checks([out], [q, k, v], [out_ref], ref_leaves, [out_pt], pt_leaves, mult)
    splits = expected_splits(batch, h, d, sq, sk, api.profile)
    checks[0].note += f" batch {batch}, {'flash_fwd_kernel' if splits == 1 else f'split-kv x{splits}'}"
    return kh.result_from_checks(case.name, checks)


def run_varlen_case(api: Api, case: VarlenCase, device: torch.device) -> kh.CaseResult:
    """flash_attn_varlen_func over packed sequences against ref_attention per sequence."""
    h, hk = HEADS[case.heads]
    d, dtype, grad = case.hdim, DTYPES[case.dtype], case.backward
    lq, lk = case.lengths_q, case.lengths_k
    batch = len(lq)
    q = torch.randn(sum(lq), h, d, dtype=dtype, device=device).requires_grad_(grad)
    k = torch.randn(sum(lk), hk, d, dtype=dtype, device=device).requires_grad_(grad)
    v = torch.randn(sum(lk), hk, d, dtype=dtype, device=device).requires_grad_(grad)
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device=device)
    window, alibi = _window(case, min(lk)), _alibi(case, batch, h, device)
    softcap = SOFTCAP if case.feature == "softcap" else 0.0
    kh.poison_allocator(kh.nbytes(q, k, v), device)
    out, lse, _ = api.varlen_fn(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=case.causal, window_size=window,
                                softcap=softcap, alibi_slopes=alibi, return_attn_probs=True)

    def packed(leaves: list[torch.Tensor], upcast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        outs, lses = [], []
        for i in range(batch):
            sq_, sk_ = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            o, s = ref_attention(leaves[0][None, sq_], leaves[1][None, sk_], leaves[2][None, sk_], causal=case.causal,
                                 window=window, softcap=softcap, alibi=None if alibi is None else alibi[i:i + 1],
                                 upcast=upcast)
            outs.append(o[0])
            lses.append(s[0])
        return torch.cat(outs, 0), torch.cat(lses, -1)

    ref_leaves, pt_leaves = _leaves(q, k, v, upcast=True), _leaves(q, k, v, upcast=False)
    out_ref, lse_ref = packed(ref_leaves, True)
    out_pt, lse_pt = packed(pt_leaves, False)
    checks = [check_vs_torch("out", out, out_ref, out_pt, OUT_MULT, OUT_ATOL), *check_lse("lse", lse, lse_ref, lse_pt)]
    if grad:
        mult = GRAD_MULT_ALIBI if alibi is not None else GRAD_MULT
        checks += grad_checks([out], [q, k, v], [out_ref], ref_leaves, [out_pt], pt_leaves, mult)
    return kh.result_from_checks(case.name, checks)


def rotary_dim(hdim: int) -> int:
    """Half the head dim, a multiple of 16 (flash_api.cpp:1411 "Only rotary dimensions divisible by 16")."""
    return max(16, hdim // 2 // 16 * 16)


def run_kvcache_case(api: Api, case: KVCase, device: torch.device) -> kh.CaseResult:
    """flash_attn_with_kvcache against ref_attention per batch row over the cache's first cache_seqlens (+ the
    appended) keys; an appended cache is compared whole (rotated k allclose 1e-3, v and the rest bitwise)."""
    h, hk = HEADS[case.heads]
    d, dtype, sq = case.hdim, DTYPES[case.dtype], case.seqlen_q
    cs = list(case.cache_seqlens)
    batch, new = len(cs), (sq if case.append != "none" else 0)
    total = [c + new for c in cs]
    if case.paged:
        per_seq = -(-(max(total) + 1) // PAGE_BLOCK)
        n_blocks = batch * per_seq + 3  # spare blocks the kernel must not touch
        table = torch.randperm(n_blocks)[:batch * per_seq].view(batch, per_seq).to(torch.int32).to(device)
        k_cache = torch.randn(n_blocks, PAGE_BLOCK, hk, d, dtype=dtype, device=device)
        v_cache = torch.randn(n_blocks, PAGE_BLOCK, hk, d, dtype=dtype, device=device)
        capacity = per_seq * PAGE_BLOCK

        def dense(cache: torch.Tensor) -> torch.Tensor:
            return cache[table.long()].reshape(batch, capacity, hk, d)
    else:
        table, capacity = None, max(total) + 5
        k_cache = torch.randn(batch, capacity, hk, d, dtype=dtype, device=device)
        v_cache = torch.randn(batch, capacity, hk, d, dtype=dtype, device=device)

        def dense(cache: torch.Tensor) -> torch.Tensor:
            return cache
    q = torch.randn(batch, sq, h, d, dtype=dtype, device=device)
    k_new = torch.randn(batch, new, hk, d, dtype=dtype, device=device) if new else None
    v_new = torch.randn(batch, new, hk, d, dtype=dtype, device=device) if new else None
    cos = sin = None
    interleaved = case.append == "rotary_il"
    if case.append.startswith("rotary"):
        angle = torch.rand(capacity, rotary_dim(d) // 2, device=device) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    window = (split_tile(d).block_n // 2 + 1, 3) if case.feature == "window" else (-1, -1)
    alibi = _alibi(case, batch, h, device)
    softcap = SOFTCAP if case.feature == "softcap" else 0.0
    seqlens = torch.tensor(cs, dtype=torch.int32, device=device)
    k_ref_cache, v_ref_cache = dense(k_cache).clone(), dense(v_cache).clone()
    k_orig, v_orig = k_cache.clone(), v_cache.clone()

    out, lse = api.kvcache_fn(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                              cache_seqlens=seqlens, block_table=table, causal=case.causal, window_size=window,
                              softcap=softcap, rotary_interleaved=interleaved, alibi_slopes=alibi,
                              num_splits=case.num_splits, return_softmax_lse=True)

    q_ro = q
    if cos is not None:
        assert k_new is not None and sin is not None
        offsets = seqlens.long()[:, None]
        k_new = rotate(k_new, cos, sin, offsets + torch.arange(new, device=device), interleaved)
        q_pos = offsets + (torch.arange(sq, device=device) if case.causal or case.feature == "window" else 0)
        q_ro = rotate(q, cos, sin, q_pos.expand(batch, sq), interleaved)
    if new:
        assert k_new is not None and v_new is not None
        for b in range(batch):
            k_ref_cache[b, cs[b]:total[b]] = k_new[b]
            v_ref_cache[b, cs[b]:total[b]] = v_new[b]
    outs: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    lses: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    for upcast in (True, False):
        for b in range(batch):
            o, s = ref_attention(q_ro[b:b + 1], k_ref_cache[b:b + 1, :total[b]], v_ref_cache[b:b + 1, :total[b]],
                                 causal=case.causal, window=window, softcap=softcap,
                                 alibi=None if alibi is None else alibi[b:b + 1], upcast=upcast)
            outs[upcast].append(o)
            lses[upcast].append(s)
    mult = KV_OUT_MULT_ALIBI if alibi is not None else KV_OUT_MULT
    checks = [check_vs_torch("out", out, torch.cat(outs[True]), torch.cat(outs[False]), mult, OUT_ATOL),
              *check_lse("lse", lse, torch.cat(lses[True]), torch.cat(lses[False]))]
    if new:
        if table is not None:  # the whole paged pool: written blocks, untouched blocks and the spares
            k_ref, v_ref = k_orig, v_orig
            k_ref[table.long()] = k_ref_cache.view(batch, -1, PAGE_BLOCK, hk, d)
            v_ref[table.long()] = v_ref_cache.view(batch, -1, PAGE_BLOCK, hk, d)
        else:
            k_ref, v_ref = k_ref_cache, v_ref_cache
        checks.append(kh.check_close("k_cache", k_cache, k_ref, KCACHE_TOL, KCACHE_TOL) if cos is not None
                      else kh.check_equal("k_cache", k_cache, k_ref))
        checks.append(kh.check_equal("v_cache", v_cache, v_ref))
    else:
        checks.append(kh.check_equal("k_cache unchanged", k_cache, k_orig))
    splits = case.num_splits or expected_splits(batch, h, d, sq, capacity, api.profile)
    checks[0].note += f" split-kv x{splits}"
    return kh.result_from_checks(case.name, checks)


def run_case(api: Api, case: Case, device: torch.device) -> kh.CaseResult:
    if isinstance(case, VarlenCase):
        return run_varlen_case(api, case, device)
    if isinstance(case, KVCase):
        return run_kvcache_case(api, case, device)
    return run_attn_case(api, case, device)


# --------------------------------------------------------------------------- speed


def bench_fwd(api: Api, device: torch.device) -> dict[str, Any]:
    """A Llama-style prefill: batch 2, 16 heads (GQA 4), 2048 tokens, head dim 128, bf16, causal; the reference is
    ref_attention in bf16 (the explicit-softmax torch path)."""
    q = torch.randn(2, 2048, 16, 128, dtype=torch.bfloat16, device=device)
    k = torch.randn(2, 2048, 4, 128, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    return kh.speed_row("fwd_b2_h16_hk4_s2048_d128_bf16_causal", lambda: api.fn(q, k, v, causal=True),
                        lambda: ref_attention(q, k, v, causal=True, upcast=False), 2 * kh.nbytes(q) + 2 * kh.nbytes(k),
                        iters=20, ref_iters=5)


# --------------------------------------------------------------------------- the suite


class FlashAttnSuite(kh.Suite):
    package = PACKAGE
    description = "Correctness checks for an installed flash-attn (FlashAttention-2) wheel, shaped by its tiling."
    quick_help = ("about 70 cases: a seeded sample that always keeps each kernel's first partial tile and the "
                  "most padded head dims, instead of about 600")

    def load(self) -> Api:
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

        prof = device_profile(torch.device("cuda")) if torch.cuda.is_available() else PROFILES["sm90"]
        self.api = Api(flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, prof, self.version())
        declared_head_dims(self.api)
        return self.api

    def probe(self, api: Api, device: torch.device) -> None:
        d = min(api.built) if api.built else 64  # a head dim the wheel has: a subset build's others are not run
        q = torch.randn(1, 3, 2, d, dtype=torch.float16, device=device)
        api.fn(q, q, q)

    def cases(self, api: Api, quick: bool) -> list[Any]:
        if api.built is None:
            probe_head_dims(api, torch.device("cuda"))
        return build_cases(api.profile, quick)

    def skip_reason(self, api: Api, case: Any) -> str | None:
        if api.built is not None and head_dim_template(case.hdim) not in api.built:
            return not_built_reason(case.hdim)
        return None

    def run_case(self, api: Api, case: Any, device: torch.device) -> kh.CaseResult:
        try:
            return run_case(api, case, device)
        except Exception as exc:  # a head dim the dispatch refuses: skipped, never passed
            if NOT_BUILT.search(str(exc)):
                return kh.CaseResult(case.name, "skipped", detail=f"{not_built_reason(case.hdim)}: "
                                                                  f"{kh.short_error(exc)}")
            raise

    def benchmarks(self, api: Api, device: torch.device, quick: bool) -> list[tuple[str, Callable[[], dict]]]:
        if api.built is not None and 128 not in api.built:
            return []
        return [("fwd_prefill", lambda: bench_fwd(api, device))]

    def run_suite(self, report: dict[str, Any], args: argparse.Namespace) -> None:
        super().run_suite(report, args)
        api = getattr(self, "api", None)
        if api is not None:
            report["profile"] = vars(api.profile)
            report["head_dims_built"] = sorted(api.built) if api.built is not None else None
            report["head_dims_not_built"] = {str(t): why for t, why in api.not_built.items()}
            report["tilings"] = [vars(t) for t in tilings(api.profile)]
            report["families"] = family_counts(report["cases"])

    def main(self, argv: Sequence[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        if "--list" in argv:
            return list_cases(argv)
        return super().main(argv)


def family_counts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family: counts by status and the worst error / allowed error."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        fam = out.setdefault(row["name"].split("/")[0], {"passed": 0, "failed": 0, "skipped": 0, "worst": None})
        fam[row["status"]] = fam.get(row["status"], 0) + 1
        if row.get("worst") is not None:
            fam["worst"] = max(fam["worst"] or 0.0, row["worst"])
    return out


def list_cases(argv: Sequence[str]) -> int:
    """--list: the tiling facts and the case design for a device profile, without a GPU or flash-attn."""
    parser = argparse.ArgumentParser(prog="kernel_tests.py --list")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--profile", default="sm90", choices=sorted(PROFILES))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--names", action="store_true", help="print every case name")
    args = parser.parse_args(argv)
    prof = PROFILES[args.profile]
    torch.manual_seed(args.seed)
    print(f"profile {prof}")
    for t in tilings(prof):
        print(f"  {t.kernel:55} {t.axis:9} {t.chunk:4}  {t.source}")
    cases = build_cases(prof, args.quick)
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.family] = counts.get(c.family, 0) + 1
    if args.names:
        for c in cases:
            print(c.name)
    print(f"{'quick' if args.quick else 'full'} (seed {args.seed}): {len(cases)} cases: "
          + ", ".join(f"{f} {n}" for f, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(FlashAttnSuite().main())
