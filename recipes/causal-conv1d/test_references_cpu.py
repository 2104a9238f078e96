"""CPU checks for kernel_tests.py: its references against independent formulations,
its case design, and the whole harness against a fake (CPU) backend, good and broken.

Run: python -m pytest recipes/causal-conv1d/test_references_cpu.py
The harness also runs through the real upstream Python interface of 1.5.2 and 1.7.0 (sdists fetched from PyPI,
or unpacked ones named in CAUSAL_CONV1D_SRC=/path/causal_conv1d-1.7.0[:...]), with the compiled module replaced by
the fake backend.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the subprocess checks below import this file by name
sys.path.insert(0, str(HERE.parent / "_harness"))
import kernel_harness as kh  # noqa: E402 (the shared harness beside the recipes)

kt = kh.load_suite(HERE / "kernel_tests.py", "causal_conv1d_kernel_tests")

CPU = torch.device("cpu")
TIGHT = dict(rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- independent formulations


def _runs(ids: List[int]) -> List[Tuple[int, int, int]]:
    """(start, stop, id) of each run of equal consecutive ids."""
    runs, start = [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or ids[t] != ids[start]:
            runs.append((start, t, ids[start]))
            start = t
    return runs


def alt_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
             init: Optional[torch.Tensor], silu: bool) -> torch.Tensor:
    """Depthwise F.conv1d: zero left padding, or the initial state prepended."""
    width, dim, seqlen = weight.shape[1], x.shape[1], x.shape[-1]
    w = weight.float().unsqueeze(1)
    b = bias.float() if bias is not None else None
    if init is None:
        y = F.conv1d(x.float(), w, b, padding=width - 1, groups=dim)[..., :seqlen]
    else:
        y = F.conv1d(torch.cat([init.float(), x.float()], -1), w, b, groups=dim)
    return F.silu(y) if silu else y


def alt_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                init: Optional[torch.Tensor] = None, seq_idx: Optional[torch.Tensor] = None,
                silu: bool = False) -> torch.Tensor:
    """Each (row, sequence) convolved on its own; the initial state feeds the row's first
    sequence; padding (id < 0) outputs 0."""
    if seq_idx is None:
        return alt_conv(x, weight, bias, init, silu)
    rows = []
    for r in range(x.shape[0]):
        pieces = []
        for k, (start, stop, sid) in enumerate(_runs(seq_idx[r].tolist())):
            seg = x[r:r + 1, :, start:stop]
            if sid < 0:
                pieces.append(torch.zeros_like(seg, dtype=torch.float32))
                continue
            seg_init = init[r:r + 1] if init is not None and k == 0 else None
            pieces.append(alt_conv(seg, weight, bias, seg_init, silu))
        rows.append(torch.cat(pieces, -1))
    return torch.cat(rows, 0)


def alt_final(x: torch.Tensor, init: Optional[torch.Tensor], width: int) -> torch.Tensor:
    """Last width-1 columns of [init or zeros | x]."""
    if init is None:
        init = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    return torch.cat([init, x], -1)[..., x.shape[-1]:]


def alt_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               silu: bool, cache_seqlens: Optional[torch.Tensor] = None,
               indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Row by row: unroll the (circular) state to oldest..newest, convolve [state | x], then
    write x into the state slot by slot. Updates conv_state in place; fp32 output."""
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    batch, dim, seqlen = x3.shape
    out = torch.zeros(batch, dim, seqlen)
    for r in range(batch):
        row = r if indices is None else int(indices[r])
        if row < 0:
            continue
        state = conv_state[row].clone()
        length = state.shape[-1]
        p = 0 if cache_seqlens is None else int(cache_seqlens[r]) % length
        logical = torch.cat([state[:, p:], state[:, :p]], -1)
        out[r] = alt_conv(torch.cat([logical, x3[r]], -1)[None], weight, bias, None, silu)[0, :, -seqlen:]
        if cache_seqlens is None:
            conv_state[row] = torch.cat([state, x3[r]], -1)[:, -length:]
        else:
            for i in range(seqlen):
                state[:, (p + i) % length] = x3[r, :, i]
            conv_state[row] = state
    return out.squeeze(-1) if x.dim() == 2 else out


# --------------------------------------------------------------------------- references vs alternatives


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 2, 5, 129])
@pytest.mark.parametrize("bias,silu", [(False, False), (True, True), (True, False)])
def test_forward_matches_conv1d(width: int, seqlen: int, bias: bool, silu: bool) -> None:
    x, w = torch.randn(3, 16, seqlen), torch.randn(16, width)
    b = torch.randn(16) if bias else None
    out, _ = kt.ref_causal_conv1d(x, w, b, activation="silu" if silu else None)
    torch.testing.assert_close(out, alt_forward(x, w, b, silu=silu), **TIGHT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_computes_in_fp32(dtype: torch.dtype) -> None:
    x, w = torch.randn(2, 8, 33, dtype=dtype), torch.randn(8, 4, dtype=dtype)
    out, final = kt.ref_causal_conv1d(x, w, activation="swish")
    assert out.dtype == torch.float32 and final.dtype == torch.float32
    torch.testing.assert_close(out, alt_forward(x.float(), w.float(), silu=True), **TIGHT)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 2, 40])
def test_initial_states_match_conv1d_on_concatenation(width: int, seqlen: int) -> None:
    x, w, b = torch.randn(2, 8, seqlen), torch.randn(8, width), torch.randn(8)
    init = torch.randn(2, 8, width - 1)
    out, final = kt.ref_causal_conv1d(x, w, b, initial_states=init)
    full = F.conv1d(torch.cat([init, x], -1), w.unsqueeze(1), b, groups=8)
    torch.testing.assert_close(out, full, **TIGHT)
    assert torch.equal(final, torch.cat([init, x], -1)[..., -(width - 1):])


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("split", [1, 2, 3, 17])
def test_split_sequence_equals_whole(width: int, split: int) -> None:
    """Running [a | b] equals running a, then b from a's final states."""
    x, w, b = torch.randn(2, 8, 20), torch.randn(8, width), torch.randn(8)
    init = torch.randn(2, 8, width - 1)
    whole, whole_final = kt.ref_causal_conv1d(x, w, b, initial_states=init, activation="silu")
    first, mid = kt.ref_causal_conv1d(x[..., :split], w, b, initial_states=init, activation="silu")
    second, final = kt.ref_causal_conv1d(x[..., split:], w, b, initial_states=mid, activation="silu")
    torch.testing.assert_close(torch.cat([first, second], -1), whole, **TIGHT)
    assert torch.equal(final, whole_final)


@pytest.mark.parametrize("width,seqlen", [(3, 1), (4, 1), (4, 2), (4, 3)])
def test_final_states_of_short_sequence_without_initial_states(width: int, seqlen: int) -> None:
    x = torch.randn(2, 8, seqlen)
    _, final = kt.ref_causal_conv1d(x, torch.randn(8, width))
    assert torch.equal(final, alt_final(x, None, width))
    assert torch.equal(final[..., : width - 1 - seqlen], torch.zeros(2, 8, width - 1 - seqlen))


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("with_init", [False, True])
def test_seq_idx_equals_separate_sequences(width: int, with_init: bool) -> None:
    x, w, b = torch.randn(3, 8, 57), torch.randn(8, width), torch.randn(8)
    init = torch.randn(3, 8, width - 1) if with_init else None
    seq_idx = kt.make_seq_idx(3, 57, "split", width, CPU)
    out, _ = kt.ref_causal_conv1d(x, w, b, initial_states=init, seq_idx=seq_idx, activation="silu")
    torch.testing.assert_close(out, alt_forward(x, w, b, init, seq_idx, silu=True), **TIGHT)


def test_seq_idx_single_sequence_equals_plain() -> None:
    x, w, init = torch.randn(2, 8, 30), torch.randn(8, 4), torch.randn(2, 8, 3)
    seq_idx = torch.full((2, 30), 7, dtype=torch.int32)
    out, _ = kt.ref_causal_conv1d(x, w, initial_states=init, seq_idx=seq_idx)
    plain, _ = kt.ref_causal_conv1d(x, w, initial_states=init)
    torch.testing.assert_close(out, plain, **TIGHT)


@pytest.mark.parametrize("width", [2, 4])
def test_seq_idx_padding_outputs_zero(width: int) -> None:
    x, w, b = torch.randn(3, 8, 64), torch.randn(8, width), torch.randn(8)
    seq_idx = kt.make_seq_idx(3, 64, "pad", width, CPU)
    assert (seq_idx < 0).any(dim=1).all(), "every row ends with padding"
    out, _ = kt.ref_causal_conv1d(x, w, b, seq_idx=seq_idx)
    assert torch.equal(out.masked_select((seq_idx < 0).unsqueeze(1)), torch.zeros(int((seq_idx < 0).sum()) * 8))
    torch.testing.assert_close(out, alt_forward(x, w, b, None, seq_idx), **TIGHT)


def test_make_seq_idx_shapes() -> None:
    for mode in ("split", "pad"):
        s = kt.make_seq_idx(2, 151, mode, 4, CPU)
        assert s.dtype == torch.int32 and s.is_contiguous() and s.shape == (2, 151)
        valid = s[s >= 0]
        assert valid.numel() and (s[:, 1:][s[:, 1:] >= 0] >= s[:, :-1][s[:, 1:] >= 0]).all()
        assert len(_runs(s[0].tolist())) >= 2, "row 0 has a short first sequence"


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 2, 37])
def test_backward_matches_conv1d_autograd(width: int, seqlen: int) -> None:
    """Grads of x, weight, bias, initial_states, with cotangents on out and final states."""
    def leaves() -> List[torch.Tensor]:
        torch.manual_seed(1)
        return [torch.randn(2, 8, seqlen, requires_grad=True), torch.randn(8, width, requires_grad=True),
                torch.randn(8, requires_grad=True), torch.randn(2, 8, width - 1, requires_grad=True)]

    g, gf = torch.randn(2, 8, seqlen), torch.randn(2, 8, width - 1)
    ours = leaves()
    out, final = kt.ref_causal_conv1d(*ours[:3], initial_states=ours[3], activation="silu")
    torch.autograd.backward([out, final], [g, gf])
    theirs = leaves()
    x, w, b, init = theirs
    torch.autograd.backward([alt_forward(x, w, b, init, silu=True), alt_final(x, init, width)], [g, gf])
    for a, c in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, c.grad, **TIGHT)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("xlen", [0, 1, 4, 5])
@pytest.mark.parametrize("state_extra", [0, 1, 3])
def test_update_equals_forward_over_concatenation(width: int, xlen: int, state_extra: int) -> None:
    state_len = width - 1 + state_extra
    x = torch.randn(4, 8) if xlen == 0 else torch.randn(4, 8, xlen)
    x3 = x.unsqueeze(-1) if xlen == 0 else x
    state, w, b = torch.randn(4, 8, state_len), torch.randn(8, width), torch.randn(8)
    before = state.clone()
    out = kt.ref_causal_conv1d_update(x, state, w, b, "silu")
    full, _ = kt.ref_causal_conv1d(torch.cat([before, x3], -1), w, b, activation="silu")
    expected = full[..., -x3.shape[-1]:]
    torch.testing.assert_close(out, expected.squeeze(-1) if xlen == 0 else expected, **TIGHT)
    assert out.shape == x.shape
    assert torch.equal(state, torch.cat([before, x3], -1)[..., -state_len:])


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("xlen", [0, 1, 5])
@pytest.mark.parametrize("state_len_extra", [0, 2, 9])
def test_update_circular_buffer_matches_unrolled(width: int, xlen: int, state_len_extra: int) -> None:
    state_len = width - 1 + state_len_extra
    x = torch.randn(6, 8) if xlen == 0 else torch.randn(6, 8, xlen)
    state, w = torch.randn(6, 8, state_len), torch.randn(8, width)
    cache = torch.randint(0, 1024, (6,), dtype=torch.int32)
    alt_state = state.clone()
    out = kt.ref_causal_conv1d_update(x, state, w, None, None, cache_seqlens=cache)
    torch.testing.assert_close(out, alt_update(x, alt_state, w, None, False, cache), **TIGHT)
    assert torch.equal(state, alt_state)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("cache", [False, True])
def test_update_with_indices_touches_only_indexed_rows(pad: bool, cache: bool) -> None:
    pool, batch = 20, 6
    x, state, w, b = torch.randn(batch, 8, 2), torch.randn(pool, 8, 5), torch.randn(8, 3), torch.randn(8)
    indices = torch.randperm(pool)[:batch].to(torch.int32)
    if pad:
        indices[::2] = -1
    cache_seqlens = torch.randint(0, 1024, (batch,), dtype=torch.int32) if cache else None
    before, alt_state = state.clone(), state.clone()
    out = kt.ref_causal_conv1d_update(x, state, w, b, "silu", cache_seqlens, indices)
    torch.testing.assert_close(out, alt_update(x, alt_state, w, b, True, cache_seqlens, indices), **TIGHT)
    assert torch.equal(state, alt_state)
    untouched = torch.ones(pool, dtype=torch.bool)
    untouched[indices[indices >= 0].long()] = False
    assert torch.equal(state[untouched], before[untouched])
    if pad:
        assert torch.equal(out[indices < 0], torch.zeros_like(out[indices < 0]))


@pytest.mark.parametrize("cache", [False, True])
def test_decode_steps_equal_prefill(cache: bool) -> None:
    """Feeding tokens one at a time through the update reproduces the forward pass."""
    width, seqlen = 4, 12
    x, w, b = torch.randn(2, 8, seqlen), torch.randn(8, width), torch.randn(8)
    state = torch.zeros(2, 8, width - 1 + (3 if cache else 0))
    outs = []
    for t in range(seqlen):
        cache_seqlens = torch.full((2,), t, dtype=torch.int32) if cache else None
        outs.append(kt.ref_causal_conv1d_update(x[:, :, t], state, w, b, "silu", cache_seqlens))
    prefill, final = kt.ref_causal_conv1d(x, w, b, activation="silu")
    torch.testing.assert_close(torch.stack(outs, -1), prefill, **TIGHT)
    if not cache:
        assert torch.equal(state, final)


def test_bad_activation_rejected() -> None:
    with pytest.raises(ValueError):
        kt.ref_causal_conv1d(torch.randn(1, 8, 4), torch.randn(8, 2), activation="relu")


# --------------------------------------------------------------------------- comparison helpers


def test_check_close_catches_nan_and_reports_error() -> None:
    ref = torch.randn(100)
    assert kt.kh.check_close("t", ref.clone(), ref, 1e-3, 1e-3).ok
    got = ref.clone()
    got[7] = float("nan")
    bad = kt.kh.check_close("t", got, ref, 1e-3, 1e-3)
    assert not bad.ok and bad.max_abs_err is None and "non-finite" in bad.note
    off = ref.clone()
    off[3] += 1.0
    miss = kt.kh.check_close("t", off, ref, 1e-3, 1e-3)
    assert not miss.ok and abs(miss.max_abs_err - 1.0) < 1e-5
    assert not kt.kh.check_close("t", ref[:5], ref, 1, 1).ok


def test_check_equal_is_bitwise() -> None:
    a = torch.randn(10, dtype=torch.bfloat16)
    assert kt.kh.check_equal("s", a.clone(), a).ok
    b = a.clone()
    b[0] = b[0] + 1
    assert not kt.kh.check_equal("s", b, a).ok
    assert not kt.kh.check_equal("s", a.float(), a).ok


# --------------------------------------------------------------------------- case design


def test_case_counts() -> None:
    torch.manual_seed(0)
    full, quick = kt.build_cases(quick=False), kt.build_cases(quick=True)
    edges, quick_edges = kt.boundary_cases(quick=False), kt.boundary_cases(quick=True)
    assert len(full) - len(edges) == 207 and len(edges) == 2 * (20 + 23 + 23) + 3 * 3 * 32
    assert len(quick) - len(quick_edges) == 19 and len(quick_edges) == 80
    for cases in (full, quick):
        names = [c.name for c in cases]
        assert len(names) == len(set(names))


def _pair_coverage_gaps(rows: List[Dict[str, Any]]) -> set:
    levels = {k: sorted({r[k] for r in rows}, key=str) for k in rows[0]}
    covered = set().union(*(kt.kh.pairs_of(list(levels), r) for r in rows))
    return kt.kh.all_pairs(levels) - covered


def test_full_fn_design_covers_every_pair_and_kernel_variant() -> None:
    cases = [c for c in kt.build_cases(quick=False) if c.family == "fn"]
    rows = [{"dtype": c.dtype, "width": c.width, "seqlen": c.seqlen, "dim": c.dim, "silu": c.silu,
             "bias": c.bias, "layout": (c.channel_last, c.initial_states, c.final_states)} for c in cases]
    assert {r["layout"] for r in rows} == {(False, False, False), (True, False, False), (True, True, True)}
    assert {r["seqlen"] for r in rows} == set(kt.SEQLENS) and {r["dim"] for r in rows} == set(kt.DIMS)
    assert len({(r["dtype"], r["width"], r["seqlen"], r["layout"]) for r in rows}) == 3 * 3 * 5 * 3 == len(rows)
    assert not _pair_coverage_gaps(rows)
    # weights in fp32 or in the (16-bit) input dtype: every pair again among 16-bit rows
    half = [{**r, "w_is_input": c.wdtype == c.dtype} for r, c in zip(rows, cases, strict=True) if c.dtype != "fp32"]
    assert not _pair_coverage_gaps(half)


def test_update_design_covers_modes_and_shapes() -> None:
    cases = [c for c in kt.build_cases(quick=False) if isinstance(c, kt.UpdateCase)]
    assert {(c.dtype, c.width, c.mode) for c in cases} == {
        (d, w, m) for d in kt.DTYPES for w in kt.WIDTHS for m in kt.UPDATE_MODES}
    assert {c.xlen for c in cases} == {0, 1, 4, 5}
    assert {c.state_layout for c in cases} == {"contig", "cl"}
    assert {c.dim for c in cases} == set(kt.UPDATE_DIMS)


def test_covering_rows_small() -> None:
    levels = {"a": [1, 2], "b": ["x", "y", "z"], "c": [True, False], "d": [0, 1]}
    rows = kt.kh.covering_rows(levels, ["b"])
    assert len(rows) == 3
    rows = kt.kh.covering_rows(levels, ["a", "b"])
    assert len(rows) == 6
    covered = set().union(*(kt.kh.pairs_of(list(levels), r) for r in rows))
    assert kt.kh.all_pairs(levels) <= covered


def test_parse_version() -> None:
    assert kt.kh.parse_version("1.5.3.post1") == (1, 5, 3)
    assert kt.kh.parse_version("1.7.0+cu12torch2.6cxx11abiTRUE") == (1, 7, 0)
    assert kt.kh.parse_version(None) is None and kt.kh.parse_version("dev") is None


# --------------------------------------------------------------------------- fake backend


class FakeKernels:
    """CPU stand-in for the compiled causal_conv1d_cuda module (same positional
    signatures), computed with the alternative formulations above. `broken` injects one bug."""

    def __init__(self, broken: Optional[str] = None) -> None:
        self.broken = broken

    def causal_conv1d_fwd(self, x, weight, bias, seq_idx, initial_states, out, final_states_out, silu):
        if self.broken == "ignore_seq_idx":
            seq_idx = None
        y = alt_forward(x, weight, bias, initial_states, seq_idx, bool(silu)).to(out.dtype)
        if self.broken == "unwritten_last_column":
            out[..., :-1].copy_(y[..., :-1])
        else:
            out.copy_(y)
        if self.broken == "drop_short_tail_output" and _short_last_chunk(x) is not None:
            out[..., -1] = float("nan")  # 9002's fault: the kernel never writes it (a GPU run sees the NaN poison)
        if final_states_out is not None and self.broken != "final_states_unwritten":
            final_states_out.copy_(alt_final(x, initial_states, weight.shape[1]))

    def causal_conv1d_bwd(self, x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dweight,
                          dbias, dinitial_states, silu):
        xs = x.detach().float().requires_grad_()
        ws = weight.detach().float().requires_grad_()
        bs = bias.detach().float().requires_grad_() if bias is not None else None
        inits = initial_states.detach().float().requires_grad_() if initial_states is not None else None

        def backprop() -> None:
            if self.broken == "short_tail_history" and silu and _short_last_chunk(x) is not None:
                # upstream's defect (9003 puts it back): SiLU's derivative taken at a pre-activation recomputed
                # with the history before a short last chunk read as zeros; the rest of the backward is linear
                pre = alt_forward(xs, ws, bs, inits, seq_idx, False)
                sig = torch.sigmoid(_pre_with_lost_history(x, weight, bias, _short_last_chunk(x)))
                torch.autograd.backward([pre], [dout.float() * sig * (1 + _pre_with_lost_history(
                    x, weight, bias, _short_last_chunk(x)) * (1 - sig))])
                return
            tensors = [alt_forward(xs, ws, bs, inits, seq_idx, bool(silu))]
            grads = [dout.float()]
            if dfinal_states is not None:
                tensors.append(alt_final(xs, inits, weight.shape[1]))
                grads.append(dfinal_states.float())
            torch.autograd.backward(tensors, grads)

        # Upstream calls this inside a torch.library.custom_op, which runs below autograd
        # (thread-local state); a fresh thread has autograd back.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(backprop).result()
        dx.copy_(xs.grad)
        dweight.add_(ws.grad * (1.01 if self.broken == "dweight_off" else 1.0))
        if dbias is not None:
            dbias.add_(bs.grad)
        if dinitial_states is not None:
            dinitial_states.copy_(inits.grad)

    def causal_conv1d_update(self, x, conv_state, weight, bias, out, silu, cache_seqlens, conv_state_indices):
        target = conv_state.clone() if self.broken == "state_not_updated" else conv_state
        y = alt_update(x, target, weight, bias, bool(silu), cache_seqlens, conv_state_indices)
        out.copy_(y.to(out.dtype))

    def as_module(self) -> types.ModuleType:
        """This backend as an importable `causal_conv1d_cuda` module."""
        module = types.ModuleType("causal_conv1d_cuda")
        for name in ("causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update"):
            setattr(module, name, getattr(self, name))
        return module


_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _short_last_chunk(x: torch.Tensor) -> Optional[int]:
    """Where the channel-first kernels' last chunk starts, if it is not the first and is shorter than one vector
    (the suite's own tiling facts, kt.channel_first_tiling); else None. Channel-last input is never affected."""
    if x.stride(1) == 1 and x.shape[1] > 1:
        return None
    tiling = kt.channel_first_tiling(_DTYPE_NAMES[x.dtype])
    start = (x.shape[-1] - 1) // tiling.chunk * tiling.chunk
    return start if start > 0 and x.shape[-1] - start < tiling.vec else None


def _pre_with_lost_history(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           start: int) -> torch.Tensor:
    """The linear pre-activation, with the taps of positions start .. start + width - 2 that reach before
    ``start`` read as zero (what the kernel's thread 0 sees when it does not load the previous chunk's tail)."""
    pre = alt_conv(x, weight, bias, None, False)
    lost = alt_conv(x[..., start:], weight, bias, None, False)
    width = weight.shape[1]
    stop = min(x.shape[-1], start + width - 1)
    pre[..., start:stop] = lost[..., :stop - start]
    return pre


class _FakeFn(torch.autograd.Function):
    """Shaped like upstream's CausalConv1dFn (including returning final_states_out as-is)."""

    @staticmethod
    def forward(ctx, kernels, x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out,
                activation):
        batch, dim, _ = x.shape
        if return_final_states and final_states_out is None:
            final_states_out = torch.empty(batch, weight.shape[1] - 1, dim, dtype=x.dtype).transpose(1, 2)
        out = torch.empty_like(x)
        silu = activation in ("silu", "swish")
        kernels.causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, out,
                                  final_states_out if return_final_states else None, silu)
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.kernels, ctx.silu, ctx.return_final_states = kernels, silu, return_final_states
        ctx.dinit = initial_states is not None and initial_states.requires_grad
        return (out, final_states_out) if return_final_states else out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, bias, seq_idx, init = ctx.saved_tensors
        dx = torch.empty_like(x)
        dweight = torch.zeros_like(weight, dtype=torch.float32)
        dbias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        dinit = torch.empty(x.shape[0], weight.shape[1] - 1, x.shape[1], dtype=x.dtype).transpose(1, 2) \
            if ctx.dinit else None
        dfinal = rest[0] if ctx.return_final_states else None
        ctx.kernels.causal_conv1d_bwd(x, weight, bias, dout, seq_idx, init, dfinal, dx, dweight, dbias, dinit,
                                      ctx.silu)
        return (None, dx, dweight.to(weight.dtype), dbias.to(bias.dtype) if dbias is not None else None, None,
                dinit, None, None, None)


def fake_api(broken: Optional[str] = None, version: str = "1.7.0", with_seq_idx: bool = True) -> kt.Api:
    """An Api whose entry points have upstream's signatures, backed by FakeKernels."""
    kernels = FakeKernels(broken)

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        return _FakeFn.apply(kernels, x, weight, bias, seq_idx, initial_states, return_final_states,
                             final_states_out, activation)

    def causal_conv1d_fn_no_seq_idx(x, weight, bias=None, initial_states=None, return_final_states=False,
                                    final_states_out=None, activation=None):
        return causal_conv1d_fn(x, weight, bias, None, initial_states, return_final_states, final_states_out,
                                activation)

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                             conv_state_indices=None):
        x3 = x.unsqueeze(-1) if x.dim() == 2 else x
        out = torch.empty_like(x3)
        kernels.causal_conv1d_update(x3, conv_state, weight, bias, out, activation in ("silu", "swish"),
                                     cache_seqlens, conv_state_indices)
        return out.squeeze(-1) if x.dim() == 2 else out

    fn = causal_conv1d_fn if with_seq_idx else causal_conv1d_fn_no_seq_idx
    return kt.Api(fn, causal_conv1d_update, version, kt.detect_features(fn, causal_conv1d_update, version))


def _run(api: kt.Api, cases) -> Dict[str, kt.kh.CaseResult]:
    torch.manual_seed(1234)
    return {r.name: r for r in kt.run_cases(api, cases, CPU)}


def _small_cases() -> List[Any]:
    """Quick design with sizes capped so the CPU run stays short."""
    cases = []
    for c in kt.build_cases(quick=True):
        if isinstance(c, kt.FnCase):
            cases.append(kt.FnCase(**{**asdict(c), "seqlen": min(c.seqlen, 300), "dim": min(c.dim, 136)}))
        else:
            cases.append(kt.UpdateCase(**{**asdict(c), "dim": 136, "batch": 8}))
    return cases


def test_harness_passes_a_correct_backend() -> None:
    results = _run(fake_api(), _small_cases())
    bad = {n: r.detail for n, r in results.items() if r.status != "passed"}
    assert not bad, bad
    for r in results.values():
        assert r.checks and r.max_abs_err is not None and r.atol > 0


@pytest.mark.heavy  # about 20 s of CPU: the integration tier
def test_harness_passes_a_correct_backend_at_full_size_quick_design() -> None:
    results = _run(fake_api(), [c for c in kt.build_cases(quick=True) if not c.family.startswith("edge_")])
    bad = {n: r.detail for n, r in results.items() if r.status != "passed"}
    assert not bad, bad


@pytest.mark.parametrize("broken,family", [
    ("unwritten_last_column", "fn"),
    ("final_states_unwritten", "fn"),
    ("dweight_off", "fn"),
    ("ignore_seq_idx", "seq_idx"),
    ("state_not_updated", "update"),
])
def test_harness_catches_a_broken_backend(broken: str, family: str) -> None:
    cases = [c for c in _small_cases() if c.name.split("/")[0] == family]
    results = _run(fake_api(broken), cases)
    failed = [r for r in results.values() if r.status == "failed"]
    assert failed, f"{broken} went unnoticed"
    if broken == "final_states_unwritten":
        assert all("final_states FAIL" in r.detail for r in failed)
        assert any("non-finite" in r.detail for r in failed), "NaN poison must show"
    if broken == "state_not_updated":
        assert all("conv_state FAIL" in r.detail for r in failed)


def test_boundary_design_derives_every_shape_from_the_tiling() -> None:
    """Every (dtype, activation) meets every channel-first chunk boundary, every dtype every channel-last L
    boundary and C-tile dim; the lengths are the declared tiling's, so a release with other chunks moves them."""
    cases = kt.boundary_cases(quick=False)
    for dtype in kt.DTYPES:
        tiling = kt.channel_first_tiling(dtype)
        assert (tiling.chunk, tiling.vec) == ((512, 4) if dtype == "fp32" else (1024, 8))
        lengths = kt.boundary_seqlens_cf(dtype)
        assert {tiling.chunk + 1, tiling.chunk + tiling.vec - 1, 2 * tiling.chunk + 1, tiling.chunk - 1} <= set(lengths)
        for silu in (False, True):
            got = {c.seqlen for c in cases if c.family == "edge_cf" and c.dtype == dtype and c.silu == silu}
            assert got == set(lengths)
        cl = [c for c in cases if c.family == "edge_cl" and c.dtype == dtype]
        assert {c.seqlen for c in cl} == set(kt.boundary_seqlens_cl(dtype)) >= {63, 64, 65, 127, 128, 129, 257}
        for mode in ({"seq_idx": "none", "initial_states": False}, {"seq_idx": "none", "initial_states": True},
                     {"seq_idx": "split", "initial_states": False}):  # every L boundary in each mode
            assert {c.seqlen for c in cl if all(getattr(c, k) == v for k, v in mode.items())} == {c.seqlen for c in cl}
        assert {c.dim for c in cl} == set(kt.boundary_dims_cl(dtype))
        assert all(c.dim % 8 == 0 for c in cl)
    edge_cf = [c for c in cases if c.family == "edge_cf"]
    assert {c.width for c in edge_cf} == set(kt.WIDTHS) and {c.strided for c in edge_cf} == {False, True}
    assert {c.initial_states for c in cases if c.family == "edge_cl"} == {False, True}


def test_quick_keeps_the_first_chunk_tails_of_every_dtype() -> None:
    for seed in (0, 1):
        torch.manual_seed(seed)
        quick = kt.boundary_cases(quick=True)
        for dtype in kt.DTYPES:
            tiling = kt.channel_first_tiling(dtype)
            tails = {c.seqlen - tiling.chunk for c in quick if c.family == "edge_cf" and c.dtype == dtype and c.silu}
            short = {n - tiling.chunk for n in kt.boundary_seqlens_cf(dtype) if tiling.chunk < n < tiling.chunk + tiling.vec}
            assert short and short <= tails
            cl = {(c.seqlen, c.seq_idx, c.initial_states) for c in quick if c.family == "edge_cl" and c.dtype == dtype}
            assert {(n, s, i) for n in (65, 66, 67) for s, i in (("none", False), ("none", True), ("split", False))} <= cl
    torch.manual_seed(0)
    a = [c.name for c in kt.boundary_cases(quick=True)]
    torch.manual_seed(0)
    assert a == [c.name for c in kt.boundary_cases(quick=True)]  # seeded: the report's seed replays it


def _cpu_sized(cases: List[Any]) -> List[Any]:
    """The same cases at CPU-friendly channel counts (lengths, which the faults depend on, kept)."""
    return [kt.FnCase(**{**asdict(c), "dim": min(c.dim, 16)}) for c in cases]


@pytest.mark.parametrize("fault", ["short_tail_history", "drop_short_tail_output"])
def test_planted_boundary_faults_are_caught_by_the_boundary_cases_only(fault: str) -> None:
    """The CPU half of issue 50's proof: a fake backend with upstream's short-tail backward defect (9003) or the
    forward's dropped tail output (9002) fails the tiling-derived cases and passes the old sampled design, so the
    boundary family, not luck, is what reaches them. The GPU half runs the real kernels (docs/GPU-RESULTS.md)."""
    edges = _cpu_sized([c for c in kt.boundary_cases(quick=False) if c.family == "edge_cf"])
    failed = [r for r in _run(fake_api(fault), edges).values() if r.status == "failed"]
    assert failed, f"{fault} went unnoticed by the boundary cases"
    for r in failed:
        dtype, length = r.name.split("/")[1], int(r.name.split("/")[3][1:])
        tiling = kt.channel_first_tiling(dtype)
        assert length > tiling.chunk and 0 < length % tiling.chunk < tiling.vec, r.name
    expect = "dx FAIL" if fault == "short_tail_history" else "out FAIL"
    assert all(expect in r.detail for r in failed)
    if fault == "short_tail_history":
        assert all("/silu/" in r.name for r in failed)
        assert {r.name.split("/")[1] for r in failed} == set(kt.DTYPES)
    old = _cpu_sized([c for c in kt.build_cases(quick=False) if c.family == "fn" and not c.channel_last])
    assert all(r.status == "passed" for r in _run(fake_api(fault), old).values())
    torch.manual_seed(3)
    quick = _cpu_sized([c for c in kt.boundary_cases(quick=True) if c.family == "edge_cf"])
    assert any(r.status == "failed" for r in _run(fake_api(fault), quick).values()), "--quick must reach it too"


def test_harness_skips_features_a_version_lacks() -> None:
    cases = _small_cases()
    old = _run(fake_api(version="1.5.2"), cases)
    skipped = {n for n, r in old.items() if r.status == "skipped"}
    assert {n.split("/")[0] for n in skipped} == {"seq_idx_pad", "seq_idx_init", "update"}
    assert all("/pad/" in n for n in skipped if n.startswith("update/"))
    assert all(old[n].detail for n in skipped)
    assert all(r.status == "passed" for n, r in old.items() if n not in skipped)
    no_seq = _run(fake_api(with_seq_idx=False), cases)
    assert all(r.status == "skipped" for n, r in no_seq.items() if n.startswith("seq_idx"))
    assert all(r.status == "passed" for n, r in no_seq.items() if n.startswith("fn/"))


def test_exception_in_kernel_is_a_failure() -> None:
    api = fake_api()

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    api.fn = boom
    cases = [c for c in _small_cases() if c.family == "fn"][:2]
    results = _run(api, cases)
    assert all(r.status == "failed" and "illegal memory access" in r.detail for r in results.values())


def test_finalize_and_json(tmp_path: Path) -> None:
    report = kt.CausalConv1dSuite().new_report(5, True)
    report["cases"] = [asdict(kt.kh.CaseResult("a", "passed", 0.1, 1e-3, 3e-4)),
                       asdict(kt.kh.CaseResult("b", "skipped", detail="why"))]
    report["speed"] = [{"name": "s", "kernel_ms": float("nan")}]
    kt.kh.finalize(report)
    assert report["status"] == "passed" and report["counts"] == {"passed": 1, "failed": 0, "skipped": 1}
    kt.kh.write_report(report, tmp_path / "sub" / "r.json")
    data = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert data["speed"][0]["kernel_ms"] is None
    report["cases"].append(asdict(kt.kh.CaseResult("c", "failed", None, 1e-3, 3e-4, detail="raised X")))
    report["status"] = None
    kt.kh.finalize(report)
    assert report["status"] == "failed"


def test_probe_detects_missing_kernel_image() -> None:
    """The probe's tiny call runs; a "no kernel image" error from it is what the harness turns into a skip."""
    api = fake_api()
    kt.CausalConv1dSuite().probe(api, CPU)

    def no_image(*args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device\n"
                           "CUDA kernel errors might be asynchronously reported")

    api.fn = no_image
    with pytest.raises(RuntimeError, match=kt.kh.NO_KERNEL_IMAGE):
        kt.CausalConv1dSuite().probe(api, CPU)


def test_main_writes_report_when_the_harness_breaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_suite(*args: Any) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(kt.CausalConv1dSuite, "run_suite", broken_suite)
    out = tmp_path / "r.json"
    assert kt.CausalConv1dSuite().main(["--out", str(out), "--seed", "3"]) == 1
    data = json.loads(out.read_text())
    assert data["status"] == "failed" and "boom" in data["reason"] and data["seed"] == 3


def test_benchmark_rows_with_stubbed_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed code needs CUDA events; here each callable runs once and 'takes' 0.5 ms
    (kernel) or 2 ms (reference)."""
    calls: List[int] = []

    def fake_timer(fn: Any, warmup: int = 10, iters: int = 50) -> float:
        fn()
        calls.append(1)
        return 0.5 if len(calls) % 2 else 2.0

    monkeypatch.setattr(kt.kh, "median_cuda_ms", fake_timer)
    rows = kt.CausalConv1dSuite().run_benchmarks(fake_api(), CPU, False)
    assert [r.get("error") for r in rows] == [None, None, None]
    fwd, _, upd = rows
    assert fwd["bytes"] == 2 * 8192 * 4096 * 2 + 8192 * 4 * 2
    assert upd["bytes"] == 2 * (64 * 8192 * 2 + 64 * 8192 * 3 * 2) + 8192 * 4 * 2
    assert fwd["speedup"] == 4.0 and abs(fwd["kernel_gbps"] - fwd["bytes"] / 0.5e-3 / 1e9) < 1e-9


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cli_without_gpu_writes_skipped_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(HERE / "kernel_tests.py"), "--out", str(out), "--quick"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "skipped" and data["reason"] == "no CUDA GPU visible to torch"
    assert data["package"] == "causal-conv1d" and isinstance(data["seed"], int)
    assert set(data) >= {"version", "torch", "gpu", "capability", "counts", "cases", "speed"}
    assert proc.stdout.strip().splitlines()[-1] == "0 passed, 0 failed, 0 skipped"


# --------------------------------------------------------------------------- real upstream interface


_REAL_RUNNER = r"""
import json, sys, torch
from dataclasses import asdict
sys.path.insert(0, {here!r})
import test_references_cpu as t
sys.modules["causal_conv1d_cuda"] = t.FakeKernels().as_module()
sys.path.insert(0, {src!r})
kt = t.kt  # the suite as the test module loaded it (one copy of its case classes)
api = kt.load_api({version!r})
torch.manual_seed(7)
results = kt.run_cases(api, t._small_cases(), torch.device("cpu"))
print(json.dumps({{"features": api.features, "results": [asdict(r) for r in results]}}))
"""


def upstream_sdist(dist: str, version: str, tmp: Path) -> Path:
    """Unpacked upstream sdist: from $CAUSAL_CONV1D_SRC if it names this version, else fetched from PyPI with the
    builder's own source stage (sha256-checked, safely extracted); skipped only when PyPI is unreachable."""
    for root in os.environ.get("CAUSAL_CONV1D_SRC", "").split(os.pathsep):
        if root and Path(root).name.endswith(f"-{version}"):
            return Path(root)
    from builder.core.errors import SourceError
    from builder.core.settings import Settings
    from builder.stages.resolve import pypi_releases
    from builder.stages.source import fetch, unpack

    settings = Settings(cache_dir=tmp / "cache", wheelhouse=tmp / "wh", recipes_dir=tmp, patches_dir=tmp)
    try:
        archive, _ = fetch(pypi_releases(dist, settings)[version], settings)
    except SourceError as e:
        pytest.skip(f"skipped: cannot fetch {dist} {version} from PyPI ({e.message})")
    return unpack(archive, tmp / "src")


@pytest.mark.network
@pytest.mark.parametrize("version", ["1.5.2", "1.7.0"])
def test_real_upstream_interface_with_fake_kernels(version: str, tmp_path: Path) -> None:
    src = str(upstream_sdist("causal-conv1d", version, tmp_path))
    version = Path(src).name.split("-", 1)[1]
    code = _REAL_RUNNER.format(here=str(HERE), src=src, version=version)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    results = data["results"]
    failed = [r["detail"] for r in results if r["status"] == "failed"]
    assert not failed, failed
    skipped = {r["name"].split("/")[0] for r in results if r["status"] == "skipped"}
    ver = kt.kh.parse_version(version)
    assert ("seq_idx_init" in skipped) == (ver < (1, 7, 0))
    assert ("seq_idx_pad" in skipped) == (ver < (1, 5, 3))
