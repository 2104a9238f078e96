#!/usr/bin/env python3
"""Correctness and speed checks for an installed fla-core wheel (gated delta rule, as Qwen3-Next uses it).

Run inside a venv that holds the wheel and torch, on a machine with an NVIDIA GPU:

    python kernel_tests.py --out RESULT.json [--quick] [--no-bench] [--seed N]

chunk_gated_delta_rule (forward and backward) and fused_recurrent_gated_delta_rule (forward; fla has no
backward for it) are compared with this file's own fp32 recurrent reference, never with fla's naive_*
functions, so a broken package cannot pass by agreeing with itself. The error measure is upstream's
(tests/ops/test_gdn.py, fla.utils.assert_close): ratio = RMS(kernel - ref) / RMS(ref), passing when below
upstream's 0.005 for o/ht, 0.008 for dq/dk/dv/dh0 and 0.02 for dbeta/dg (twice that in bf16, see RATIO_TOL),
or when the largest absolute difference is at most 1e-6. Every kernel result must be finite, and every case
runs the kernel twice on the same inputs (the caching allocator poisoned with NaN before each run): both runs
must agree bit for bit, which catches nondeterminism and output memory the kernel never writes.

Supports fla-core 0.4.0 through 0.6.0. Grouped value heads (GVA: 16 q/k heads, 32 value heads, as in
Qwen3-Next) are used where the installed version's kernel supports them (chunk from 0.5.0, fused_recurrent
from 0.4.0); elsewhere those cases run with 16/16 heads and say so. Inputs are fresh random numbers each run;
the seed is recorded. Exit code: 0 passed, 1 failed, 3 skipped (no CUDA GPU).
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

# fla >= 0.5.2 may route calls to other backends (tilelang, FlashQLA, ...); the build farm tests the Triton
# kernels the wheel ships. The recipe's [test] env sets this too.
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

try:
    import kernel_harness as kh  # on PYTHONPATH when the builder runs the suite
except ImportError:  # run in place from a checkout or an unpacked recipes/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "_harness"))
    import kernel_harness as kh

PACKAGE = "fla-core"
DTYPES = kh.DTYPES
# Upstream's assert_close ratios (tests/ops/test_gdn.py::test_chunk, test_gated_delta.py::test_chunk), which
# upstream applies to fp16 only. bf16 has 3 fewer mantissa bits (8x the unit roundoff): an fp32 emulation of the
# chunk kernel's storage precisions (A^-1, w, u, h, v_new, o rounded to the input dtype) gives o/ht ratios of
# 2e-4..4e-4 in fp16 but 1.7e-3..3.5e-3 in bf16, too close to 0.005, so bf16 gets twice upstream's ratios.
RATIO_TOL: Dict[str, float] = {"o": 0.005, "ht": 0.005, "dq": 0.008, "dk": 0.008, "dv": 0.008, "dh0": 0.008,
                               "dbeta": 0.02, "dg": 0.02}
DTYPE_TOL_FACTOR: Dict[str, float] = {"fp32": 1.0, "fp16": 1.0, "bf16": 2.0}
ABS_PASS = 1e-6  # upstream: a largest absolute difference this small passes whatever the ratio

QK_HEADS, V_HEADS, HEAD_DIM = 16, 32, 128  # Qwen3-Next's linear-attention layers
HEADS = ("gva", "mha32")  # gva: 16 q/k heads + 32 value heads; mha32: 32/32, what transformers passes fla
STATES = ("h0+ht", "ht", "none")  # initial state given and final state returned / final only / neither
GATES = ("logsigmoid", "weak", "qwen")
CHUNK_SHAPES = ((1, 1024), (2, 1000), (2, 65))
RECURRENT_SHAPES = ((16, 1), (2, 1000), (1, 63))
REF_SEGMENT = 64  # the reference's backward recomputes per segment of this many steps (bounded memory)
GRAD_NAMES = ("q", "k", "v", "g", "beta", "h0")
# Errors fla raises on purpose for a GPU + Triton pair it knows to compute wrong results on. They are not defects
# of the wheel, so the refused part of a case is reported as skipped with fla's own words (the rest of the case
# is still checked). fla-core 0.6.0: gated chunk backward on Hopper with Triton 3.4.0-3.7.0 (upstream #640).
UPSTREAM_REFUSALS = (re.compile(r"Triton .* on Hopper GPUs produces incorrect results"),)
# Experiment only (never set by the builder): lift that guard to see whether the results really are wrong.
BYPASS_GUARD_ENV = "FLA_TEST_BYPASS_HOPPER_GUARD"


# --------------------------------------------------------------------------- reference


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm: x / sqrt(sum(x^2) + eps) over the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _ref_steps(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time. q, k [B, T, HV, K] (already normalised, scaled and expanded
    to the value heads), v [B, T, HV, V], g and beta [B, T, HV], state [B, HV, K, V]; all fp32.

    For each t:  S <- S * exp(g_t);  u = beta_t * (v_t - S^T k_t);  S <- S + k_t u^T;  o_t = S^T q_t.
    """
    outs = []
    decay = g.exp()
    for t in range(q.shape[1]):
        state = state * decay[:, t, :, None, None]
        k_t = k[:, t]
        u = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)) * beta[:, t, :, None]
        state = state + k_t.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, dim=1), state


def ref_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm: bool = False,
    segment: int = REF_SEGMENT,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gated delta rule in fp32, differentiable; fla's argument conventions.

    q, k [B, T, H, K]; v [B, T, HV, V] with HV a multiple of H (value head j uses q/k head j // (HV // H));
    g [B, T, HV] log decay; beta [B, T, HV]; initial_state [B, HV, K, V]; scale defaults to K ** -0.5.
    use_qk_l2norm normalises q and k first (fla's use_qk_l2norm_in_kernel). Returns (o [B, T, HV, V],
    final state [B, HV, K, V] or None), both fp32. With autograd on, each segment of `segment` steps is
    recomputed in the backward pass instead of keeping every intermediate state.
    """
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    batch, seqlen, heads, dim_k = q.shape
    v_heads, dim_v = v.shape[2], v.shape[3]
    if v_heads % heads:
        raise ValueError(f"value heads ({v_heads}) must be a multiple of q/k heads ({heads})")
    if use_qk_l2norm:
        q, k = l2norm_ref(q), l2norm_ref(k)
    if v_heads != heads:
        q = q.repeat_interleave(v_heads // heads, dim=2)
        k = k.repeat_interleave(v_heads // heads, dim=2)
    q = q * (dim_k ** -0.5 if scale is None else scale)
    state = (initial_state.float() if initial_state is not None
             else q.new_zeros(batch, v_heads, dim_k, dim_v))
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
    outs = []
    for start in range(0, seqlen, segment):
        part = [x[:, start:start + segment] for x in (q, k, v, g, beta)]
        if grad:
            o, state = checkpoint(_ref_steps, state, *part, use_reentrant=False)
        else:
            o, state = _ref_steps(state, *part)
        outs.append(o)
    o = torch.cat(outs, dim=1) if outs else v.new_zeros(batch, 0, v_heads, dim_v)
    return o, (state if output_final_state else None)


# --------------------------------------------------------------------------- comparison


def ratio_tol(tensor: str, dtype: str) -> float:
    """The ratio a tensor must stay below: upstream's, scaled for bf16."""
    return RATIO_TOL[tensor] * DTYPE_TOL_FACTOR[dtype]


# --------------------------------------------------------------------------- the package under test


@dataclass
class Api:
    """The package's entry points plus which optional features this version has."""

    chunk: Callable[..., Any]
    recurrent: Callable[..., Any]
    flags: Dict[str, Any]  # fla.utils' device flags (device_flags)
    version: Optional[str]
    features: Dict[str, bool]
    fla_utils: Any = None


def _module_source(module: Any) -> Optional[str]:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return None


def detect_features(chunk: Callable[..., Any], recurrent: Callable[..., Any], chunk_source: Optional[str],
                    recurrent_source: Optional[str], version: Optional[str]) -> Dict[str, bool]:
    """GVA support from the kernels' sources (they index value heads as HV), else from the version."""
    ver = kh.parse_version(version)
    chunk_params = set(inspect.signature(chunk).parameters)
    rec_params = set(inspect.signature(recurrent).parameters)
    gva_chunk = ("HV" in chunk_source) if chunk_source is not None else (ver is not None and ver >= (0, 5, 0))
    gva_rec = ("HV" in recurrent_source) if recurrent_source is not None else (ver is not None and ver >= (0, 4, 0))
    return {
        "gva_chunk": gva_chunk,
        "gva_recurrent": gva_rec,
        "l2norm_chunk": "use_qk_l2norm_in_kernel" in chunk_params,
        "l2norm_recurrent": "use_qk_l2norm_in_kernel" in rec_params,
    }


def device_flags(fla_utils: Any) -> Dict[str, Any]:
    """The hardware flags fla derived for this GPU (None: the version has no such flag)."""
    names = ("IS_NVIDIA", "IS_NVIDIA_HOPPER", "IS_NVIDIA_BLACKWELL", "IS_NVIDIA_SM100", "IS_NVIDIA_SM120",
             "IS_TMA_SUPPORTED", "USE_CUDA_GRAPH", "is_nvidia", "is_nvidia_hopper", "is_tma_supported")
    flags = {}
    for name in names:
        value = getattr(fla_utils, name, None)
        flags[name] = value if isinstance(value, (bool, int, str)) or value is None else repr(value)
    return flags


def bypass_hopper_guard() -> None:
    """The experiment behind BYPASS_GUARD_ENV: make fla's chunk_bwd_dqkwg believe Triton is >= 3.7.1."""
    import importlib

    for name in ("fla.ops.common.chunk_o",):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "TRITON_ABOVE_3_7_1"):
            module.TRITON_ABOVE_3_7_1 = True
            print(f"experiment: {name}.TRITON_ABOVE_3_7_1 forced to True (Hopper guard lifted)", flush=True)


def load_api(version: Optional[str]) -> Api:
    """Import the installed package (raises if the wheel is broken)."""
    import fla  # noqa: F401
    import fla.ops.gated_delta_rule.chunk as chunk_mod
    import fla.ops.gated_delta_rule.fused_recurrent as rec_mod
    import fla.utils as fla_utils
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    features = detect_features(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule,
                               _module_source(chunk_mod), _module_source(rec_mod), version)
    if os.environ.get(BYPASS_GUARD_ENV) == "1":
        bypass_hopper_guard()
    return Api(chunk=chunk_gated_delta_rule, recurrent=fused_recurrent_gated_delta_rule, version=version,
               features=features, flags=device_flags(fla_utils), fla_utils=fla_utils)


# --------------------------------------------------------------------------- case design


@dataclass(frozen=True)
class GdrCase:
    """One call configuration of chunk_gated_delta_rule or fused_recurrent_gated_delta_rule."""

    op: str  # "chunk" (forward + backward) | "recurrent" (forward only) | "chunk-fwd-only" (backward refused)
    dtype: str
    batch: int
    seqlen: int
    heads: str  # see HEADS
    states: str  # see STATES
    l2norm: bool  # use_qk_l2norm_in_kernel=True with raw q/k; False: q/k l2-normalised by the test
    gate: str  # see GATES
    g_dtype: str  # "fp32" or "input"
    qk_heads: int = QK_HEADS
    v_heads: int = V_HEADS
    note: str = ""

    @property
    def backward(self) -> bool:
        return self.op == "chunk"

    @property
    def name(self) -> str:
        return "/".join([self.op, self.dtype, f"B{self.batch}", f"T{self.seqlen}",
                         f"h{self.qk_heads}v{self.v_heads}", self.states,
                         "l2norm_in_kernel" if self.l2norm else "prenorm", f"gate_{self.gate}",
                         f"g_{self.g_dtype}", "fwd+bwd" if self.backward else "fwd"])


def _resolve_heads(case: GdrCase, features: Dict[str, bool]) -> GdrCase:
    """Map the symbolic head layout to numbers for this version (GVA → 16/16 where unsupported)."""
    if case.heads == "mha32":
        return replace(case, qk_heads=V_HEADS, v_heads=V_HEADS)
    if features.get(f"gva_{case.op}", False):
        return replace(case, qk_heads=QK_HEADS, v_heads=V_HEADS)
    return replace(case, qk_heads=QK_HEADS, v_heads=QK_HEADS,
                   note=f"{case.op} kernel of this version has no grouped value heads: 16/16 heads used")


def _rows(shapes: Tuple[Tuple[int, int], ...], fixed: List[str]) -> List[Tuple[int, int, Dict[str, Any]]]:
    """(batch, seqlen, the other factors) of each case that covers every pair of factor values, crossing the
    ``fixed`` factors in full; ``shapes`` are the (batch, seqlen) pairs to use."""
    levels = {"dtype": ["fp16", "bf16"], "shape": list(shapes), "heads": list(HEADS),
              "l2norm": [False, True], "states": list(STATES), "gate": list(GATES), "g_dtype": ["fp32", "input"]}
    rows = []
    for row in kh.covering_rows(levels, fixed):
        batch, seqlen = row.pop("shape")
        rows.append((batch, seqlen, row))
    return rows


def chunk_cases(quick: bool) -> List[GdrCase]:
    if quick:
        rows = _rows(((2, 1000), (1, 1024)), ["dtype", "heads"])
    else:
        rows = _rows(CHUNK_SHAPES, ["dtype", "shape", "heads", "l2norm"])
    cases = [GdrCase(op="chunk", batch=batch, seqlen=seqlen, **row) for batch, seqlen, row in rows]
    # What Qwen3-Next training/prefill does, always included: bf16, GVA, state in and out, in-kernel l2norm,
    # Qwen-style strong decays in fp32.
    cases.append(GdrCase(op="chunk", dtype="bf16", batch=2, seqlen=1000, heads="gva", states="h0+ht",
                         l2norm=True, gate="qwen", g_dtype="fp32"))
    return cases


def recurrent_cases(quick: bool) -> List[GdrCase]:
    if quick:
        rows = _rows(((16, 1), (2, 1000)), ["dtype", "heads"])
    else:
        rows = _rows(RECURRENT_SHAPES, ["dtype", "shape", "heads"])
    cases = []
    for batch, seqlen, row in rows:
        if seqlen == 1:
            row["states"] = "h0+ht"  # a decode step always carries the state in and out
        cases.append(GdrCase(op="recurrent", batch=batch, seqlen=seqlen, **row))
    return cases


def build_cases(quick: bool, features: Dict[str, bool]) -> List[GdrCase]:
    """All cases of a run (about 40 full, about 10 with --quick), heads resolved for this version;
    a configuration that comes up twice runs once."""
    cases: Dict[str, GdrCase] = {}
    for case in [*chunk_cases(quick), *recurrent_cases(quick)]:
        resolved = _resolve_heads(case, features)
        cases.setdefault(resolved.name, resolved)
    return list(cases.values())


# --------------------------------------------------------------------------- case runners


def make_gate(batch: int, seqlen: int, heads: int, kind: str, device: torch.device) -> torch.Tensor:
    """Log decays g (fp32): upstream's logsigmoid(U(0,1)) (about -0.3..-1.3), a weak one (/10), or
    Qwen3-Next's -A * softplus(a + dt_bias) with A ~ U(0.01, 16) per head (decays down to about e^-20)."""
    if kind == "logsigmoid":
        return F.logsigmoid(torch.rand(batch, seqlen, heads, device=device))
    if kind == "weak":
        return F.logsigmoid(torch.rand(batch, seqlen, heads, device=device)) / 10
    if kind == "qwen":
        a_coef = torch.empty(heads, device=device).uniform_(0.01, 16)
        a = torch.randn(batch, seqlen, heads, device=device)
        return -a_coef * F.softplus(a + 1.0)
    raise ValueError(f"unknown gate {kind!r}")


def make_inputs(case: GdrCase, device: torch.device) -> Dict[str, Optional[torch.Tensor]]:
    """Random inputs in the case's dtypes (q/k/v/beta in the input dtype; h0 fp32, as fla keeps states)."""
    dtype = DTYPES[case.dtype]
    b, t, h, hv, d = case.batch, case.seqlen, case.qk_heads, case.v_heads, HEAD_DIM
    q = torch.randn(b, t, h, d, device=device)
    k = torch.randn(b, t, h, d, device=device)
    if not case.l2norm:
        q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    g = make_gate(b, t, hv, case.gate, device)
    return {
        "q": q.to(dtype),
        "k": k.to(dtype),
        "v": torch.randn(b, t, hv, d, device=device).to(dtype),
        "g": g if case.g_dtype == "fp32" else g.to(dtype),
        "beta": torch.randn(b, t, hv, device=device).sigmoid().to(dtype),
        "h0": torch.randn(b, hv, d, d, device=device) if case.states == "h0+ht" else None,
    }


def run_kernel(api: Api, case: GdrCase, inputs: Dict[str, Optional[torch.Tensor]],
               cotangents: Dict[str, Optional[torch.Tensor]], device: torch.device) -> Dict[str, Optional[torch.Tensor]]:
    """One kernel call (+ backward for chunk) on fresh leaf copies; returns detached results."""
    grad = case.backward
    leaves = {n: (t.detach().clone().requires_grad_(grad) if t is not None else None) for n, t in inputs.items()}
    want_final = case.states != "none"
    kwargs: Dict[str, Any] = dict(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"], beta=leaves["beta"],
                                  initial_state=leaves["h0"], output_final_state=want_final)
    if case.l2norm:
        kwargs["use_qk_l2norm_in_kernel"] = True
    fn = api.chunk if case.op.startswith("chunk") else api.recurrent
    state_bytes = case.batch * case.v_heads * HEAD_DIM * HEAD_DIM * 4
    kh.poison_allocator(4 * kh.nbytes(*inputs.values()) + 4 * state_bytes, device)
    o, ht = fn(**kwargs)
    results: Dict[str, Optional[torch.Tensor]] = {"o": o.detach().clone(),
                                                  "ht": ht.detach().clone() if ht is not None else None}
    if grad:
        tensors, grads = [o], [cotangents["do"]]
        if ht is not None:
            tensors.append(ht)
            grads.append(cotangents["dht"])
        kh.poison_allocator(4 * kh.nbytes(*inputs.values()) + 4 * state_bytes, device)
        try:
            torch.autograd.backward(tensors, grads)
        except RuntimeError as exc:
            if not upstream_refusal(exc):
                raise
            results["backward_refused"] = kh.short_error(exc)  # type: ignore[assignment]
            return results
        for n in GRAD_NAMES:
            if leaves[n] is not None:
                results[f"d{n}"] = leaves[n].grad.detach().clone() if leaves[n].grad is not None else None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return results


def run_reference(case: GdrCase, inputs: Dict[str, Optional[torch.Tensor]],
                  cotangents: Dict[str, Optional[torch.Tensor]]) -> Dict[str, Optional[torch.Tensor]]:
    """The fp32 reference on fp32 copies of exactly the kernel's (rounded) inputs."""
    grad = case.backward
    leaves = {n: (t.detach().float().requires_grad_(grad) if t is not None else None) for n, t in inputs.items()}
    with torch.set_grad_enabled(grad):
        o, ht = ref_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                     initial_state=leaves["h0"], output_final_state=case.states != "none",
                                     use_qk_l2norm=case.l2norm)
    results: Dict[str, Optional[torch.Tensor]] = {"o": o.detach(), "ht": ht.detach() if ht is not None else None}
    if grad:
        tensors, grads = [o], [cotangents["do"].float()]
        if ht is not None:
            tensors.append(ht)
            grads.append(cotangents["dht"].float())
        torch.autograd.backward(tensors, grads)
        for n in GRAD_NAMES:
            if leaves[n] is not None:
                results[f"d{n}"] = leaves[n].grad.detach()
    return results


def upstream_refusal(exc: BaseException) -> bool:
    """True for an error fla raises on purpose for a known-bad GPU + Triton pair (see UPSTREAM_REFUSALS)."""
    return any(pattern.search(str(exc)) for pattern in UPSTREAM_REFUSALS)


def run_gdr_case(api: Api, case: GdrCase, device: torch.device) -> List[kh.CaseResult]:
    """Kernel twice (bitwise equal), then against the fp32 reference (upstream's error ratio).

    One result per case; two when fla refused the backward on purpose: the forward (checked) and the backward
    (skipped, with fla's message)."""
    dtype = DTYPES[case.dtype]
    inputs = make_inputs(case, device)
    b, t, hv, d = case.batch, case.seqlen, case.v_heads, HEAD_DIM
    cotangents = {"do": torch.randn(b, t, hv, d, device=device).to(dtype) if case.backward else None,
                  "dht": torch.randn(b, hv, d, d, device=device)
                  if case.backward and case.states != "none" else None}
    first = run_kernel(api, case, inputs, cotangents, device)
    refused = first.pop("backward_refused", None)
    stem = case.name.rsplit("/", 1)[0]
    if refused is not None:
        case = replace(case, op="chunk-fwd-only")
    second = run_kernel(api, case, inputs, cotangents, device)
    second.pop("backward_refused", None)
    ref = run_reference(case, inputs, cotangents)
    checks: List[kh.Check] = []
    if first["o"].dtype != dtype:
        checks.append(kh.Check("o.dtype", False, None, note=f"o is {first['o'].dtype}, inputs are {dtype}"))
    for name in ref:
        if ref[name] is None and first.get(name) is None:
            continue
        checks.append(kh.check_ratio(name, first.get(name), ref[name], ratio_tol(name, case.dtype)))
    for name in first:
        checks.append(kh.check_equal(f"repeat:{name}", second.get(name), first[name], "elements differ between two runs"))
    if refused is None:
        result = kh.result_from_checks(case.name, checks)
        if case.note:
            result.detail = f"{case.note}; {result.detail}"
        return [result]
    forward = kh.result_from_checks(f"{stem}/fwd", checks)
    forward.detail = f"backward refused by fla, forward checked; {forward.detail}"
    return [forward, kh.CaseResult(f"{stem}/bwd", "skipped", detail=f"refused by fla-core itself: {refused}")]


def run_blackwell_flag_case(api: Api, device: torch.device) -> kh.CaseResult:
    """fla must classify compute capability 10.x and 12.x as Blackwell (our patch for 0.4.1-0.5.0)."""
    name = "device_flags/IS_NVIDIA_BLACKWELL"
    flag = getattr(api.fla_utils, "IS_NVIDIA_BLACKWELL", None)
    if flag is None:
        return kh.CaseResult(name, "skipped", detail="this fla-core version has no IS_NVIDIA_BLACKWELL flag")
    major, minor = torch.cuda.get_device_capability(device)
    expected = major in (10, 12)
    ok = bool(flag) == expected
    detail = f"capability {major}.{minor}: IS_NVIDIA_BLACKWELL={flag}, expected {expected}"
    return kh.CaseResult(name, "passed" if ok else "failed", detail=detail)


# --------------------------------------------------------------------------- speed


def _qwen_inputs(api: Api, batch: int, seqlen: int, device: torch.device, op: str,
                 with_state: bool) -> Tuple[Dict[str, Optional[torch.Tensor]], str]:
    gva = api.features.get(f"gva_{op}", False)
    h = QK_HEADS if gva else V_HEADS  # without GVA, pass what transformers passes: q/k repeated to 32 heads
    case = GdrCase(op=op, dtype="bf16", batch=batch, seqlen=seqlen, heads="gva", states="h0+ht" if with_state
                   else "none", l2norm=True, gate="qwen", g_dtype="fp32", qk_heads=h, v_heads=V_HEADS)
    return make_inputs(case, device), f"h{h}v{V_HEADS}"


def bench_chunk(api: Api, device: torch.device, quick: bool, backward: bool) -> Dict[str, Any]:
    """Qwen3-Next prefill: B=1, T=4096, 16 q/k + 32 value heads, D=128, bf16, l2norm in kernel, fp32 g."""
    b, t = 1, 4096
    x, heads = _qwen_inputs(api, b, t, device, "chunk", with_state=False)
    leaves = {n: v.detach().clone().requires_grad_(backward) for n, v in x.items() if v is not None}
    ref_leaves = {n: v.detach().float().requires_grad_(backward) for n, v in x.items() if v is not None}
    do = torch.randn_like(x["v"])

    def kernel() -> Any:
        o, _ = api.chunk(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"], beta=leaves["beta"],
                         use_qk_l2norm_in_kernel=True)
        if backward:
            o.backward(do)
        return o

    def reference() -> Any:
        o, _ = ref_gated_delta_rule(ref_leaves["q"], ref_leaves["k"], ref_leaves["v"], ref_leaves["g"],
                                    ref_leaves["beta"], use_qk_l2norm=True)
        if backward:
            o.backward(do.float())
        return o

    io = kh.nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], x["v"])  # read inputs, write o
    nbytes = 2 * io if backward else io  # backward: read do + inputs, write the five gradients (roughly)
    name = f"chunk_{'fwd_bwd' if backward else 'fwd'}_qwen3next_B{b}_T{t}_{heads}_D{HEAD_DIM}_bf16"
    return _timed_row(name, kernel, reference, nbytes, quick=quick, grad=backward)


def bench_recurrent(api: Api, device: torch.device, quick: bool, batch: int, seqlen: int) -> Dict[str, Any]:
    """fused_recurrent: a decode step (T=1, state in and out) or the prefill shape, bf16."""
    with_state = seqlen == 1
    x, heads = _qwen_inputs(api, batch, seqlen, device, "recurrent", with_state=with_state)

    def kernel() -> Any:
        return api.recurrent(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["h0"],
                             output_final_state=with_state, use_qk_l2norm_in_kernel=True)

    def reference() -> Any:
        return ref_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                    output_final_state=with_state, use_qk_l2norm=True)

    nbytes = kh.nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], x["v"]) + 2 * kh.nbytes(x["h0"])
    kind = "decode" if seqlen == 1 else "prefill"
    name = f"recurrent_{kind}_B{batch}_T{seqlen}_{heads}_D{HEAD_DIM}_bf16" + ("_state_in_out" if with_state else "")
    return _timed_row(name, kernel, reference, nbytes, quick=quick)


def _timed_row(name: str, kernel: Callable[[], Any], reference: Callable[[], Any], nbytes: int, *, quick: bool,
               grad: bool = False) -> Dict[str, Any]:
    """The reference is a token-by-token loop: time it once (quick) or three times."""
    return kh.speed_row(name, kernel, reference, nbytes, grad=grad, warmup=3 if quick else 10,
                        iters=5 if quick else 30, ref_warmup=1, ref_iters=1 if quick else 3)


# --------------------------------------------------------------------------- the suite


class FlaSuite(kh.Suite):
    package = PACKAGE
    description = "Correctness and speed checks for an installed fla-core wheel (gated delta rule)."
    quick_help = "about 10 cases instead of about 40"
    env_vars = ("FLA_DISABLE_BACKEND_DISPATCH", BYPASS_GUARD_ENV)
    refusals = UPSTREAM_REFUSALS

    def load(self) -> Api:
        return load_api(self.version())

    def report_extra(self, api: Api) -> Dict[str, Any]:
        return {"features": api.features, "device_flags": api.flags}

    def cases(self, api: Api, quick: bool) -> List[Any]:
        return build_cases(quick, api.features)

    def skip_reason(self, api: Api, case: GdrCase) -> Optional[str]:
        if case.l2norm and not api.features.get(f"l2norm_{case.op}", False):
            return "no use_qk_l2norm_in_kernel parameter in this version"
        return None

    def run_case(self, api: Api, case: GdrCase, device: torch.device) -> List[kh.CaseResult]:
        return run_gdr_case(api, case, device)

    def group_key(self, case: GdrCase) -> Tuple[Any, ...]:
        """Cases that share Triton autotune keys (op, dtypes, head counts) go together: a worker compiles and
        autotunes each kernel once for its group, and groups compile in parallel."""
        return (case.op, case.dtype, case.qk_heads, case.v_heads, case.g_dtype)

    def preliminary_cases(self, api: Api, device: torch.device) -> List[kh.CaseResult]:
        return [run_blackwell_flag_case(api, device)]

    def benchmarks(self, api: Api, device: torch.device, quick: bool) -> List[Tuple[str, Callable[[], Dict]]]:
        return [("chunk_fwd", lambda: bench_chunk(api, device, quick, backward=False)),
                ("chunk_fwd_bwd", lambda: bench_chunk(api, device, quick, backward=True)),
                ("recurrent_decode", lambda: bench_recurrent(api, device, quick, batch=32, seqlen=1)),
                ("recurrent_prefill", lambda: bench_recurrent(api, device, quick, batch=1, seqlen=4096))]


if __name__ == "__main__":
    sys.exit(FlaSuite().main())
