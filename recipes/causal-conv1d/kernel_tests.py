#!/usr/bin/env python3
"""Correctness and speed checks for an installed causal-conv1d wheel.

Run inside a venv that holds the wheel and torch, on a machine with an NVIDIA GPU:

    python kernel_tests.py --out RESULT.json [--quick] [--no-bench] [--seed N] [--only REGEX]

Every kernel result is compared with this file's own pure-torch fp32 references
(never with the package's *_ref functions, so a broken package cannot pass by
agreeing with itself). Inputs are fresh random numbers each run; the seed is
recorded. Exit code: 0 passed, 1 failed, 3 skipped. Supports causal-conv1d
1.5.2 through 1.7.0; features a version lacks are skipped with a reason.
The CLI, report, timing and check helpers are the shared harness (recipes/_harness).
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

try:
    import kernel_harness as kh  # on PYTHONPATH when the builder runs the suite
except ImportError:  # run in place from a checkout or an unpacked recipes/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "_harness"))
    import kernel_harness as kh

PACKAGE = "causal-conv1d"
DTYPES = kh.DTYPES
# (rtol, atol), as upstream tests/test_causal_conv1d.py uses for outputs, dx and dinitial_states.
TOLERANCES: Dict[str, Tuple[float, float]] = {"fp32": (3e-4, 1e-3), "fp16": (3e-3, 5e-3), "bf16": (1e-2, 5e-2)}
# Upstream's (rtolw, atolw) for dweight and dbias, with fp32 weights.
WEIGHT_GRAD_TOL_FP32: Tuple[float, float] = (1e-3, 1e-3)

WIDTHS = [2, 3, 4]
SEQLENS = [1, 129, 151, 1134, 4096]
DIMS = [64, 4128]
UPDATE_DIMS = [2048, 2064, 4096]
FN_BATCH = 2
UPDATE_BATCH = 64
POOL_FACTOR = 10  # conv_state pool rows per batch row when conv_state_indices is used
LAYOUTS = ["cf", "cl", "cl_states"]  # channel-first; channel-last; channel-last + initial/final states
UPDATE_MODES = ["plain", "cache", "gather", "gather_cache", "pad"]

# --------------------------------------------------------------------------- the kernels' structure
# Read from upstream's csrc/ (the same in 1.5.2 through 1.7.0); the boundary families below derive every shape
# from these facts, so a new release whose tiling changes is re-read here, not re-guessed.
CF_THREADS = 128  # causal_conv1d_fwd.cu / _bwd.cu: `causal_conv1d_fwd_launch<128, 2, input_t, weight_t>` (and bwd)
CL_THREADS_PER_LOAD_ROWS = 16  # channel-last: kNColsPerLoad = kNColsPerWarp (32 / 8) * kNWarps (128 / 32)
CL_FWD_CHUNK_L = 64  # causal_conv1d_fwd.cu: `Causal_conv1d_channellast_fwd_kernel_traits<kNThreads, kWidth, 64, ...>`
CL_BWD_CHUNK_L = (64, 128)  # causal_conv1d_bwd.cu: `kChunk = kChunkSizeL64 ? 64 : 128` with `params.seqlen <= 128`
UPDATE_THREADS = 64  # causal_conv1d_update.cu: `causal_conv1d_update_launch<64, 2, ...>`: one channel per thread
MAX_WIDTH = 4  # causal_conv1d.cpp: `width >= 2 && width <= 4`


def vec_elements(dtype: str) -> int:
    """kNElts: `static constexpr int kNElts = kNBytes == 4 ? 4 : 8;` (a 16-byte load per thread)."""
    return 4 if dtype == "fp32" else 8


def channel_first_tiling(dtype: str) -> kh.Tiling:
    """Channel-first fwd and bwd: one block per (batch, channel) walks the sequence in chunks of kNThreads x kNElts;
    the vector path runs only when seqlen % kNElts == 0 (`BOOL_SWITCH(params.seqlen % kNElts == 0, kIsVecLoad`)."""
    vec = vec_elements(dtype)
    return kh.Tiling("causal_conv1d_{fwd,bwd}_kernel (channel-first)", "seqlen", CF_THREADS * vec, vec,
                     "csrc/causal_conv1d_bwd.cu: `constexpr int kChunkSize = kNThreads * kNElts;`")


def channel_last_tilings(dtype: str) -> List[kh.Tiling]:
    """Channel-last fwd/bwd: 2-D tiles of kChunkSizeL positions x kChunkSizeC channels, loaded 16 rows at a time;
    kChunkSizeC = kNEltsPerRow = 128 / sizeof(input_t) channels, kNElts of them per thread."""
    vec = vec_elements(dtype)
    source = "csrc/causal_conv1d_fwd.cu: `static constexpr int kNEltsPerRow = 128 / kNBytes;`"
    return [kh.Tiling("causal_conv1d_channellast_fwd_kernel", "seqlen", CL_FWD_CHUNK_L, CL_THREADS_PER_LOAD_ROWS,
                      "csrc/causal_conv1d_fwd.cu: `Causal_conv1d_channellast_fwd_kernel_traits<kNThreads, kWidth, 64`"),
            *[kh.Tiling("causal_conv1d_channellast_bwd_kernel", "seqlen", chunk, CL_THREADS_PER_LOAD_ROWS,
                        "csrc/causal_conv1d_bwd.cu: `static constexpr int kChunk = kChunkSizeL64 ? 64 : 128;`")
              for chunk in CL_BWD_CHUNK_L],
            kh.Tiling("causal_conv1d_channellast_{fwd,bwd}_kernel", "dim", 128 // (4 if dtype == "fp32" else 2), vec,
                      source)]


def boundary_seqlens_cf(dtype: str) -> List[int]:
    """Every chunk boundary of the channel-first kernels for this dtype, plus tails shorter than the filter."""
    return channel_first_tiling(dtype).boundaries(chunks=2, tails=range(1, MAX_WIDTH))


def boundary_seqlens_cl(dtype: str) -> List[int]:
    """The channel-last kernels' L-chunk boundaries (fwd 64, bwd 64 up to seqlen 128 and 128 above)."""
    lengths: set = set()
    for tiling in channel_last_tilings(dtype):
        if tiling.axis == "seqlen":
            lengths.update(tiling.boundaries(chunks=2, tails=range(1, MAX_WIDTH)))
    return sorted(lengths)


def boundary_dims_cl(dtype: str) -> List[int]:
    """Channel counts around the channel-last C tile: upstream requires dim % 8 == 0, so 8, a tile less 8, a tile,
    a tile and 8, two tiles less 8."""
    tile = next(t for t in channel_last_tilings(dtype) if t.axis == "dim")
    return [d for d in tile.boundaries(chunks=1, tails=(8, tile.chunk - 8)) if d % 8 == 0]


FEATURE_REASONS = {
    "seq_idx": "causal_conv1d_fn has no seq_idx parameter",
    "initial_states": "causal_conv1d_fn has no initial_states/return_final_states parameters",
    "seq_idx_padding": "seq_idx < 0 (padding) zeroes outputs only from causal-conv1d 1.5.3",
    "seq_idx_initial_states": "seq_idx together with initial_states needs causal-conv1d >= 1.7.0",
    "cache_seqlens": "causal_conv1d_update has no cache_seqlens parameter",
    "conv_state_indices": "causal_conv1d_update has no conv_state_indices parameter",
    "conv_state_indices_padding": "conv_state_indices < 0 (padding) is handled only from causal-conv1d 1.5.3",
}


# --------------------------------------------------------------------------- references


def _silu_or_identity(out: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    """Apply the package's activation convention: None, "silu" or "swish"."""
    if activation is None:
        return out
    if activation in ("silu", "swish"):
        return F.silu(out)
    raise ValueError(f"unsupported activation {activation!r}")


def ref_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d in fp32; returns (out, final_states), differentiable.

    x (batch, dim, seqlen), weight (dim, width), bias (dim,), initial_states
    (batch, dim, width-1). out[b,c,t] = act(bias[c] + sum_k weight[c,k] * xs[b,c,t+k])
    where xs = [initial_states or zeros | x]; final_states = last width-1 columns of xs.
    With seq_idx (batch, seqlen): taps from another sequence count as zero (the initial
    state belongs to seq_idx[:, 0]) and positions with seq_idx < 0 (padding) output 0.
    """
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    x32 = x.float()
    state = x32.new_zeros(batch, dim, width - 1) if initial_states is None else initial_states.float()
    xs = torch.cat([state, x32], dim=-1)
    windows = xs.unfold(-1, width, 1)  # (batch, dim, seqlen, width)
    if seq_idx is not None:
        first = seq_idx[:, :1] if initial_states is not None else torch.full_like(seq_idx[:, :1], -1)
        ids = torch.cat([first.expand(-1, width - 1), seq_idx], dim=-1).unfold(-1, width, 1)
        windows = windows * (ids == seq_idx.unsqueeze(-1)).unsqueeze(1).to(windows.dtype)
    out = (windows * weight.float()[None, :, None, :]).sum(-1)
    if bias is not None:
        out = out + bias.float()[None, :, None]
    out = _silu_or_identity(out, activation)
    if seq_idx is not None:
        out = out.masked_fill((seq_idx < 0).unsqueeze(1), 0.0)
    return out, xs[..., seqlen:]


def ref_causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    cache_seqlens: Optional[torch.Tensor] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Decode-step conv in fp32; updates conv_state (pool, dim, state_len) in place.

    Without cache_seqlens the state is a shift register: it rolls left by seqlen and x is
    appended. With cache_seqlens it is a circular buffer whose next write slot is
    cache_seqlens % state_len. conv_state_indices picks pool rows; a row < 0 is padding:
    output 0 and no state change. x is (batch, dim) or (batch, dim, seqlen).
    """
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    batch, dim, seqlen = x3.shape
    width, state_len = weight.shape[1], conv_state.shape[-1]
    dev = x.device
    rows = torch.arange(batch, device=dev) if conv_state_indices is None else conv_state_indices.long()
    valid = rows >= 0
    states = conv_state[rows.clamp(min=0)]  # gathered copy (batch, dim, state_len)
    if cache_seqlens is None:
        hist = states[..., state_len - (width - 1):]
        new_states = torch.cat([states, x3.to(states.dtype)], dim=-1)[..., -state_len:]
    else:
        start = cache_seqlens.long()
        hist_pos = (start[:, None] + torch.arange(-(width - 1), 0, device=dev)) % state_len
        hist = states.gather(2, hist_pos[:, None, :].expand(-1, dim, -1))
        new_states = states.clone()
        b = torch.arange(batch, device=dev)
        for i in range(seqlen):  # sequential writes: the last write to a slot wins
            new_states[b, :, (start + i) % state_len] = x3[:, :, i].to(states.dtype)
    out, _ = ref_causal_conv1d(x3, weight, bias, initial_states=hist, activation=activation)
    out = out.masked_fill(~valid[:, None, None], 0.0)
    conv_state[rows[valid]] = new_states[valid]
    return out.squeeze(-1) if x.dim() == 2 else out


def weight_grad_tolerance(wdtype: str) -> Tuple[float, float]:
    """dweight/dbias tolerance: upstream's 1e-3/1e-3 for fp32 weights, else the weight dtype's own."""
    return WEIGHT_GRAD_TOL_FP32 if wdtype == "fp32" else TOLERANCES[wdtype]


# --------------------------------------------------------------------------- the package under test


@dataclass
class Api:
    """The package's entry points plus which optional features this version has."""

    fn: Callable[..., Any]
    update: Callable[..., Any]
    version: Optional[str]
    features: Dict[str, bool]
    upstream_ref_fn: Optional[Callable[..., Any]] = None
    upstream_ref_update: Optional[Callable[..., Any]] = None


def detect_features(fn: Callable[..., Any], update: Callable[..., Any], version: Optional[str],
                    fn_source: Optional[str] = None) -> Dict[str, bool]:
    """Feature flags from the signatures, plus behaviour that only the version (or the
    interface source) reveals. fn_source: source of the autograd forward, if readable."""
    fn_params = set(inspect.signature(fn).parameters)
    upd_params = set(inspect.signature(update).parameters)
    ver = kh.parse_version(version)
    at_least_153 = ver is not None and ver >= (1, 5, 3)
    seq_idx = "seq_idx" in fn_params
    init = {"initial_states", "return_final_states"} <= fn_params
    if fn_source is not None:
        seq_init = "initial_states must be None if seq_idx" not in fn_source
    else:
        seq_init = ver is not None and ver >= (1, 7, 0)
    indices = "conv_state_indices" in upd_params
    return {
        "seq_idx": seq_idx,
        "initial_states": init,
        "final_states_out": "final_states_out" in fn_params,
        "seq_idx_padding": seq_idx and at_least_153,
        "seq_idx_initial_states": seq_idx and init and seq_init,
        "cache_seqlens": "cache_seqlens" in upd_params,
        "conv_state_indices": indices,
        "conv_state_indices_padding": indices and at_least_153,
    }


def load_api(version: Optional[str]) -> Api:
    """Import the installed package (raises if the wheel is broken)."""
    import causal_conv1d  # noqa: F401  (loads the compiled extension)
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from causal_conv1d import causal_conv1d_interface as iface

    try:
        source: Optional[str] = inspect.getsource(iface.CausalConv1dFn.forward)
    except (AttributeError, OSError, TypeError):
        source = None
    return Api(
        fn=causal_conv1d_fn,
        update=causal_conv1d_update,
        version=version,
        features=detect_features(causal_conv1d_fn, causal_conv1d_update, version, source),
        upstream_ref_fn=getattr(iface, "causal_conv1d_ref", None),
        upstream_ref_update=getattr(iface, "causal_conv1d_update_ref", None),
    )


# --------------------------------------------------------------------------- case design


@dataclass(frozen=True)
class FnCase:
    """One causal_conv1d_fn configuration (forward, and backward unless disabled)."""

    family: str
    dtype: str
    width: int
    seqlen: int
    dim: int
    silu: bool
    bias: bool
    wdtype: str  # "fp32" or the input dtype name
    channel_last: bool = False
    initial_states: bool = False
    final_states: bool = False
    seq_idx: str = "none"  # "none" | "split" | "pad"
    backward: bool = True
    batch: int = FN_BATCH
    strided: bool = False  # x a channel-strided view, weight stored transposed (non-contiguous)

    @property
    def name(self) -> str:
        layout = "cl" if self.channel_last else "cf"
        if self.strided:
            layout += "+strided"
        if self.initial_states:
            layout += "+init"
        if self.final_states:
            layout += "+final"
        parts = [self.family, self.dtype, f"w{self.width}", f"L{self.seqlen}", f"d{self.dim}", layout,
                 "silu" if self.silu else "noact", "bias" if self.bias else "nobias", f"w_{self.wdtype}"]
        if not self.backward:
            parts.append("fwd-only")
        return "/".join(parts)

    def required_features(self) -> List[str]:
        needs = []
        if self.initial_states or self.final_states:
            needs.append("initial_states")
        if self.seq_idx != "none":
            needs.append("seq_idx")
        if self.seq_idx == "pad":
            needs.append("seq_idx_padding")
        if self.seq_idx != "none" and self.initial_states:
            needs.append("seq_idx_initial_states")
        return needs


@dataclass(frozen=True)
class UpdateCase:
    """One causal_conv1d_update configuration."""

    dtype: str
    width: int
    mode: str  # see UPDATE_MODES
    xlen: int  # 0: x is (batch, dim); else (batch, dim, xlen)
    dim: int
    silu: bool
    bias: bool
    state_layout: str  # "contig" (pool, dim, state_len) or "cl" (pool, state_len, dim).transpose
    wdtype: str
    state_extra: int  # state_len = width - 1 + state_extra
    batch: int = UPDATE_BATCH

    @property
    def family(self) -> str:
        return "update"

    @property
    def name(self) -> str:
        x = "x2d" if self.xlen == 0 else f"x3d_L{self.xlen}"
        return "/".join(["update", self.dtype, f"w{self.width}", self.mode, x, f"d{self.dim}",
                         f"state{self.width - 1 + self.state_extra}_{self.state_layout}",
                         "silu" if self.silu else "noact", "bias" if self.bias else "nobias", f"w_{self.wdtype}"])

    def required_features(self) -> List[str]:
        return {
            "plain": [],
            "cache": ["cache_seqlens"],
            "gather": ["conv_state_indices"],
            "gather_cache": ["conv_state_indices", "cache_seqlens"],
            "pad": ["conv_state_indices", "conv_state_indices_padding"],
        }[self.mode]


Case = Union[FnCase, UpdateCase]


def _wdtypes(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Resolve the symbolic weight dtype "input" to the row's input dtype."""
    for row in rows:
        if row.get("wdtype") == "input":
            row["wdtype"] = row["dtype"]
    return rows


def fn_cases(quick: bool) -> List[FnCase]:
    """Main causal_conv1d_fn family: every (dtype, width, layout, seqlen) in full mode."""
    levels = {"dtype": list(DTYPES), "width": WIDTHS, "layout": LAYOUTS, "seqlen": SEQLENS,
              "dim": DIMS, "silu": [False, True], "bias": [False, True], "wdtype": ["fp32", "input"]}
    fixed = ["dtype", "layout"] if quick else ["dtype", "width", "layout", "seqlen"]
    cases = []
    for row in _wdtypes(kh.covering_rows(levels, fixed)):
        layout = row.pop("layout")
        cases.append(FnCase(family="fn", channel_last=layout != "cf", initial_states=layout == "cl_states",
                            final_states=layout == "cl_states", **row))
    return cases


def seq_idx_cases(quick: bool) -> List[FnCase]:
    """seq_idx families (channel-last only): split sequences, padding, split + initial states."""
    families = [
        # family, seq_idx mode, initial_states, backward, seqlens
        ("seq_idx", "split", False, True, [151, 1134, 4096]),
        ("seq_idx_pad", "pad", False, False, [129, 1134]),
        ("seq_idx_init", "split", True, True, [151, 1134]),
    ]
    cases = []
    for family, mode, init, backward, seqlens in families:
        levels = {"dtype": list(DTYPES), "width": WIDTHS, "seqlen": seqlens, "dim": DIMS,
                  "silu": [False, True], "bias": [False, True], "wdtype": ["fp32", "input"]}
        if quick:
            fixed = ["dtype"] if family == "seq_idx" else []
            levels["dtype"] = levels["dtype"] if family == "seq_idx" else ["bf16"]
        else:
            fixed = ["dtype", "width"]
        for row in _wdtypes(kh.covering_rows(levels, fixed)):
            cases.append(FnCase(family=family, channel_last=True, initial_states=init, seq_idx=mode,
                                backward=backward, **row))
    return cases


def boundary_cases(quick: bool) -> List[FnCase]:
    """Forward + backward at every boundary the kernels' tiling has (see channel_first_tiling and
    channel_last_tilings): channel-first for every dtype x activation x boundary seqlen, channel-last for every
    dtype x boundary seqlen x mode (plain, states, seq_idx), the other factors covered pairwise. --quick keeps,
    for every dtype and both layouts, the lengths just past the first chunk (see _first_chunk_tail) and a seeded
    sample of the rest."""
    cases: List[FnCase] = []
    for dtype in DTYPES:
        levels = {"dtype": [dtype], "silu": [False, True], "seqlen": boundary_seqlens_cf(dtype), "width": WIDTHS,
                  "bias": [False, True], "wdtype": ["fp32", "input"], "dim": [3, 64], "strided": [False, True]}
        cases += [FnCase(family="edge_cf", **row) for row in _wdtypes(kh.covering_rows(levels, ["silu", "seqlen"]))]
        levels = {"dtype": [dtype], "seqlen": boundary_seqlens_cl(dtype), "mode": list(CL_MODES),
                  "dim": boundary_dims_cl(dtype), "width": WIDTHS, "silu": [False, True], "bias": [False, True],
                  "wdtype": ["fp32", "input"]}
        for row in _wdtypes(kh.covering_rows(levels, ["seqlen", "mode"])):
            states = row["mode"] == "states"
            seq_idx = "split" if row.pop("mode") == "seq_idx" else "none"
            cases.append(FnCase(family="edge_cl", channel_last=True, initial_states=states, final_states=states,
                                seq_idx=seq_idx, **row))
    if not quick:
        return cases
    return kh.seeded_sample(cases, 80, keep=_first_chunk_tail)


CL_MODES = ("plain", "states", "seq_idx")  # channel-last extras: none, initial + final states, split sequences


def _first_chunk_tail(case: FnCase) -> bool:
    """The case's sequence ends just inside the kernel's second chunk: channel-first 0..vec+1 elements in with SiLU
    (a history crosses a chunk edge into a short last chunk), channel-last 1..3 (a partial last L-chunk)."""
    if case.channel_last:
        return CL_FWD_CHUNK_L < case.seqlen < CL_FWD_CHUNK_L + MAX_WIDTH
    tiling = channel_first_tiling(case.dtype)
    return tiling.chunk <= case.seqlen <= tiling.chunk + tiling.vec + 1 and case.silu


def update_cases(quick: bool) -> List[UpdateCase]:
    """causal_conv1d_update family: every (dtype, width, mode) in full mode."""
    levels = {"dtype": list(DTYPES), "width": WIDTHS, "mode": UPDATE_MODES, "xlen": [0, 1, 4, 5],
              "dim": UPDATE_DIMS, "silu": [False, True], "bias": [False, True],
              "state_layout": ["contig", "cl"], "wdtype": ["fp32", "input"], "state_extra": [0, 1, 5, 10]}
    fixed = ["mode"] if quick else ["dtype", "width", "mode"]
    return [UpdateCase(**row) for row in _wdtypes(kh.covering_rows(levels, fixed))]


def build_cases(quick: bool) -> List[Case]:
    """All cases of a run (about 630 full, about 100 with --quick)."""
    return [*fn_cases(quick), *seq_idx_cases(quick), *update_cases(quick), *boundary_cases(quick)]


# --------------------------------------------------------------------------- case runners


def make_seq_idx(batch: int, seqlen: int, mode: str, width: int, device: torch.device) -> torch.Tensor:
    """Random increasing sequence ids (int32, contiguous); "pad" ends each row with -1s.
    Row 0 always starts with a short sequence (1..width tokens) to cross the state boundary."""
    rows = []
    for b in range(batch):
        true_len = seqlen if mode == "split" else int(torch.randint(max(1, seqlen // 2), seqlen, ()).item())
        cuts = set()
        if true_len > 1:
            n_cuts = int(torch.randint(1, 5, ()).item())
            cuts = {int(c) + 1 for c in torch.randperm(true_len - 1)[:n_cuts]}
            if b == 0:
                cuts.add(int(torch.randint(1, width + 1, ()).item()) if true_len > width else 1)
        ids = torch.zeros(true_len, dtype=torch.int64)
        for cut in cuts:
            ids[cut:] += 1
        ids += 2 * b + 3  # ids need not start at 0
        pad = torch.full((seqlen - true_len,), -1, dtype=torch.int64)
        rows.append(torch.cat([ids, pad]))
    return torch.stack(rows).to(device=device, dtype=torch.int32).contiguous()


def _randn_layout(shape_cf: Tuple[int, int, int], channel_last: bool, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """(b, c, n) tensor, stored channel-last ((b, n, c).transpose(1, 2)) if asked."""
    b, c, n = shape_cf
    if channel_last:
        return torch.randn(b, n, c, dtype=dtype, device=device).transpose(1, 2)
    return torch.randn(b, c, n, dtype=dtype, device=device)


def run_fn_case(api: Api, case: FnCase, device: torch.device) -> kh.CaseResult:
    """causal_conv1d_fn forward (+ backward) against ref_causal_conv1d."""
    dtype, wdtype = DTYPES[case.dtype], DTYPES[case.wdtype]
    rtol, atol = TOLERANCES[case.dtype]
    b, d, n, w = case.batch, case.dim, case.seqlen, case.width
    grad = case.backward
    if case.strided:  # every other channel of a wider tensor; weight stored (width, dim) and transposed
        x = torch.randn(b, 2 * d, n, dtype=dtype, device=device)[:, ::2].requires_grad_(grad)
        weight = torch.randn(w, d, dtype=wdtype, device=device).t().requires_grad_(grad)
    else:
        x = _randn_layout((b, d, n), case.channel_last, dtype, device).requires_grad_(grad)
        weight = torch.randn(d, w, dtype=wdtype, device=device).requires_grad_(grad)
    bias = torch.randn(d, dtype=wdtype, device=device).requires_grad_(grad) if case.bias else None
    init = _randn_layout((b, d, w - 1), True, dtype, device).requires_grad_(grad) if case.initial_states else None
    seq_idx = make_seq_idx(b, n, case.seq_idx, w, device) if case.seq_idx != "none" else None
    activation = "silu" if case.silu else None

    kwargs: Dict[str, Any] = {"activation": activation}
    if seq_idx is not None:
        kwargs["seq_idx"] = seq_idx
    if init is not None:
        kwargs["initial_states"] = init
    final_buf = None
    if case.final_states:
        kwargs["return_final_states"] = True
        if api.features.get("final_states_out"):
            final_buf = torch.full((b, w - 1, d), float("nan"), dtype=dtype, device=device).transpose(1, 2)
            kwargs["final_states_out"] = final_buf

    kh.poison_allocator(kh.nbytes(x), x.device)
    result = api.fn(x, weight, bias, **kwargs)
    out, final = result if case.final_states else (result, None)

    leaves = {k: (t.detach().float().requires_grad_(grad) if t is not None else None)
              for k, t in {"x": x, "weight": weight, "bias": bias, "init": init}.items()}
    ref_out, ref_final = ref_causal_conv1d(leaves["x"], leaves["weight"], leaves["bias"], leaves["init"],
                                           seq_idx, activation)
    checks = [kh.check_close("out", out, ref_out, rtol, atol)]
    if case.final_states:
        got_final = final_buf if final_buf is not None else final
        checks.append(kh.check_equal("final_states", got_final, ref_final.detach().to(dtype)))
    if grad:
        checks += _fn_backward_checks(case, (out, final), (ref_out, ref_final),
                                      {"x": x, "weight": weight, "bias": bias, "init": init}, leaves)
    return kh.result_from_checks(case.name, checks)


def _fn_backward_checks(case: FnCase, outs: Tuple[torch.Tensor, Optional[torch.Tensor]],
                        ref_outs: Tuple[torch.Tensor, torch.Tensor], inputs: Dict[str, Optional[torch.Tensor]],
                        leaves: Dict[str, Optional[torch.Tensor]]) -> List[kh.Check]:
    """Backprop the same random cotangents through kernel and reference; compare grads."""
    out, final = outs
    g = torch.randn_like(out)
    tensors, grads, ref_tensors, ref_grads = [out], [g], [ref_outs[0]], [g.float()]
    if case.final_states:
        gf = torch.randn_like(final)
        tensors.append(final)
        grads.append(gf)
        ref_tensors.append(ref_outs[1])
        ref_grads.append(gf.float())
    for t in inputs.values():
        if t is not None:
            kh.poison_allocator(kh.nbytes(t), t.device)
    torch.autograd.backward(tensors, grads)
    torch.autograd.backward(ref_tensors, ref_grads)
    rtol, atol = TOLERANCES[case.dtype]
    rtolw, atolw = weight_grad_tolerance(case.wdtype)
    tols = {"x": (rtol, atol), "init": (rtol, atol), "weight": (rtolw, atolw), "bias": (rtolw, atolw)}
    checks = []
    for key, t in inputs.items():
        if t is None:
            continue
        if t.grad is None:
            checks.append(kh.Check(f"d{key}", False, None, tols[key][1], tols[key][0], note="no gradient returned"))
            continue
        checks.append(kh.check_close(f"d{key}", t.grad, leaves[key].grad, *tols[key]))
    return checks


def run_update_case(api: Api, case: UpdateCase, device: torch.device) -> kh.CaseResult:
    """causal_conv1d_update against ref_causal_conv1d_update; conv_state must match bitwise."""
    dtype, wdtype = DTYPES[case.dtype], DTYPES[case.wdtype]
    rtol, atol = TOLERANCES[case.dtype]
    b, d, w = case.batch, case.dim, case.width
    state_len = w - 1 + case.state_extra
    gather = case.mode in ("gather", "gather_cache", "pad")
    pool = b * POOL_FACTOR if gather else b
    if case.xlen == 0:
        x = torch.randn(b, d, dtype=dtype, device=device)
    else:
        x = torch.randn(b, case.xlen, d, dtype=dtype, device=device).transpose(1, 2)
    conv_state = _randn_layout((pool, d, state_len), case.state_layout == "cl", dtype, device)
    weight = torch.randn(d, w, dtype=wdtype, device=device)
    bias = torch.randn(d, dtype=wdtype, device=device) if case.bias else None
    activation = "silu" if case.silu else None

    kwargs: Dict[str, Any] = {"activation": activation}
    indices = None
    if gather:
        indices = torch.randperm(pool)[:b]
        if case.mode == "pad":
            indices[torch.randperm(b)[: b // 2]] = -1
        indices = indices.to(device=device, dtype=torch.int32)
        kwargs["conv_state_indices"] = indices
    cache_seqlens = None
    if case.mode in ("cache", "gather_cache"):
        cache_seqlens = torch.randint(0, 1024, (b,), dtype=torch.int32, device=device)
        kwargs["cache_seqlens"] = cache_seqlens

    state_ref = conv_state.clone()
    kh.poison_allocator(kh.nbytes(x), x.device)
    out = api.update(x, conv_state, weight, bias, **kwargs)
    ref_out = ref_causal_conv1d_update(x, state_ref, weight, bias, activation, cache_seqlens, indices)
    checks = [kh.check_close("out", out, ref_out, rtol, atol), kh.check_equal("conv_state", conv_state, state_ref)]
    return kh.result_from_checks(case.name, checks)


# --------------------------------------------------------------------------- cross-check and speed


def crosscheck_upstream_refs(api: Api, device: torch.device) -> List[Dict[str, Any]]:
    """Informational only: our references against the package's own *_ref functions."""
    notes: List[Dict[str, Any]] = []
    try:
        if api.upstream_ref_fn is not None:
            x = torch.randn(2, 64, 151, device=device)
            w, bias = torch.randn(64, 4, device=device), torch.randn(64, device=device)
            init = torch.randn(2, 64, 3, device=device)
            theirs, their_final = api.upstream_ref_fn(x, w, bias, initial_states=init, return_final_states=True,
                                                      activation="silu")
            ours, our_final = ref_causal_conv1d(x, w, bias, initial_states=init, activation="silu")
            notes.append({"name": "causal_conv1d_ref", "max_abs_diff": (ours - theirs).abs().max().item(),
                          "final_states_equal": torch.equal(our_final, their_final)})
        if api.upstream_ref_update is not None:
            x = torch.randn(4, 64, device=device)
            w = torch.randn(64, 4, device=device)
            state = torch.randn(4, 64, 5, device=device)
            their_state, our_state = state.clone(), state.clone()
            theirs = api.upstream_ref_update(x, their_state, w, None, "silu")
            ours = ref_causal_conv1d_update(x, our_state, w, None, "silu")
            notes.append({"name": "causal_conv1d_update_ref", "max_abs_diff": (ours - theirs).abs().max().item(),
                          "conv_state_equal": torch.equal(our_state, their_state)})
    except Exception as exc:  # noqa: BLE001  (informational)
        notes.append({"name": "crosscheck", "error": kh.short_error(exc)})
    return notes


def bench_fwd(api: Api, device: torch.device, channel_last: bool) -> Dict[str, Any]:
    """Qwen3-Next prefill shape: batch 1, dim 8192, width 4, seqlen 4096, bf16, silu, no bias."""
    b, d, n, w = 1, 8192, 4096, 4
    x = _randn_layout((b, d, n), channel_last, torch.bfloat16, device)
    weight = torch.randn(d, w, dtype=torch.bfloat16, device=device)
    nbytes = kh.nbytes(x, weight) + x.numel() * x.element_size()  # read x + weight, write out
    name = f"fwd_qwen3next_b{b}_d{d}_L{n}_w{w}_bf16_silu_{'channel_last' if channel_last else 'channel_first'}"
    return kh.speed_row(name, lambda: api.fn(x, weight, None, activation="silu"),
                      lambda: ref_causal_conv1d(x, weight, None, activation="silu"), nbytes)


def bench_update(api: Api, device: torch.device) -> Dict[str, Any]:
    """Decode step: batch 64, dim 8192, width 4, x (batch, dim), state_len 3, bf16, silu."""
    b, d, w = 64, 8192, 4
    x = torch.randn(b, d, dtype=torch.bfloat16, device=device)
    state = torch.randn(b, d, w - 1, dtype=torch.bfloat16, device=device)
    ref_state = state.clone()
    weight = torch.randn(d, w, dtype=torch.bfloat16, device=device)
    nbytes = 2 * kh.nbytes(x, state) + kh.nbytes(weight)  # read x + state + weight, write out + state
    return kh.speed_row(f"update_decode_b{b}_d{d}_w{w}_bf16_silu", lambda: api.update(x, state, weight, None, "silu"),
                      lambda: ref_causal_conv1d_update(x, ref_state, weight, None, "silu"), nbytes)


# --------------------------------------------------------------------------- the suite


class CausalConv1dSuite(kh.Suite):
    package = PACKAGE
    description = "Correctness and speed checks for an installed causal-conv1d wheel."
    quick_help = "about 100 cases (every dtype's first-chunk tails and a seeded sample of the other boundaries) instead of about 630"

    def load(self) -> Api:
        self.api = load_api(self.version())
        return self.api

    def probe(self, api: Api, device: torch.device) -> None:
        api.fn(torch.randn(1, 64, 16, device=device), torch.randn(64, 4, device=device), None)

    def report_extra(self, api: Api) -> Dict[str, Any]:
        return {"features": api.features}

    def cases(self, api: Api, quick: bool) -> List[Any]:
        return build_cases(quick)

    def skip_reason(self, api: Api, case: Any) -> Optional[str]:
        for feature in case.required_features():
            if not api.features.get(feature, False):
                return FEATURE_REASONS[feature]
        return None

    def run_case(self, api: Api, case: Any, device: torch.device) -> kh.CaseResult:
        return run_fn_case(api, case, device) if isinstance(case, FnCase) else run_update_case(api, case, device)

    def benchmarks(self, api: Api, device: torch.device, quick: bool) -> List[Tuple[str, Callable[[], Dict]]]:
        return [("fwd_channel_last", lambda: bench_fwd(api, device, True)),
                ("fwd_channel_first", lambda: bench_fwd(api, device, False)),
                ("update_decode", lambda: bench_update(api, device))]

    def run_suite(self, report: Dict[str, Any], args: Any) -> None:
        super().run_suite(report, args)
        if report["cases"]:  # informational: our references against the package's own
            report["reference_crosscheck"] = crosscheck_upstream_refs(self.api, torch.device("cuda"))


def run_cases(api: Api, cases: Sequence[Any], device: torch.device) -> List[kh.CaseResult]:
    return CausalConv1dSuite().run_cases(api, cases, device)


if __name__ == "__main__":
    sys.exit(CausalConv1dSuite().main())
