#!/usr/bin/env python3
"""GPU benchmark (issue 9, item 5): our causal-conv1d and fla-core kernels at Qwen3-Next shapes, against the
pure-torch code transformers runs when they are missing, and their bandwidth against this GPU's copy bandwidth.

    python bench/gpu_kernels.py --out RESULT.json [--repeats 5]

Needs a CUDA GPU and, importable: torch, causal_conv1d, fla (our wheels) and transformers (for its Qwen3-Next
fallbacks: torch_causal_conv1d_update, torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule; the
prefill conv fallback is the model's own nn.Conv1d call, written out here). Shapes: conv dim 8192 (16 key heads x
128 x 2 + 32 value heads x 128), width 4, bf16; gated delta rule with 32 value heads (q/k repeated to 32, as
transformers does before calling either path), head dim 128, bf16, fp32 gates, l2norm in kernel.

Each row: median over `repeats` runs of the median of `iters` CUDA-event timings (spread = min..max of the
per-run medians), for the kernel and for the fallback; bandwidth = the bytes the op must read and write at least,
divided by the kernel's time, and as a fraction of the measured device-to-device copy bandwidth (read + write
of a 1 GiB buffer). Peak memory is torch.cuda.max_memory_allocated above the inputs, per call.
"""
from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes" / "_harness"))
from kernel_harness import median_cuda_ms  # the recipes' CUDA-event timing: one copy for both

CONV_DIM, CONV_WIDTH = 8192, 4
V_HEADS, HEAD_DIM = 32, 128
DTYPE = torch.bfloat16


def repeated(fn: Callable[[], Any], repeats: int, iters: int) -> dict[str, float]:
    """Median and spread of per-run medians."""
    runs = [median_cuda_ms(fn, warmup=3, iters=iters) for _ in range(repeats)]
    return {"ms": statistics.median(runs), "min_ms": min(runs), "max_ms": max(runs)}


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Extra memory one call allocates at its peak."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def copy_bandwidth(repeats: int) -> dict[str, float]:
    """Device-to-device copy of 1 GiB: GB/s counting the read and the write."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = repeated(lambda: dst.copy_(src), repeats, iters=20)
    return {"gbps": 2 * (1 << 30) / (t["ms"] * 1e-3) / 1e9, **t}


# --------------------------------------------------------------------------- the ops


def conv_prefill(batch: int, seqlen: int) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    from causal_conv1d import causal_conv1d_fn

    x = torch.randn(batch, CONV_DIM, seqlen, device="cuda", dtype=DTYPE)
    w = torch.randn(CONV_DIM, CONV_WIDTH, device="cuda", dtype=DTYPE)

    def kernel() -> Any:
        return causal_conv1d_fn(x, w, None, activation="silu")

    def fallback() -> Any:  # Qwen3NextGatedDeltaNet without the kernel: act(conv1d(x)[..., :seq_len])
        return F.silu(F.conv1d(x, w.unsqueeze(1), None, padding=CONV_WIDTH - 1, groups=CONV_DIM)[..., :seqlen])

    return kernel, fallback, nbytes(x, w, x)


def torch_causal_conv1d_update(x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                               activation: str | None) -> torch.Tensor:
    """transformers' decode fallback for Qwen3-Next (torch_causal_conv1d_update; not importable by that name from
    every transformers release, so written out): append, keep the last `width` columns, depthwise conv, SiLU."""
    seq_len, state_len = x.shape[-1], state.shape[-1]
    full = torch.cat([state, x], dim=-1).to(w.dtype)
    state.copy_(full[:, :, -state_len:])
    out = F.conv1d(full, w.unsqueeze(1), bias, padding=0, groups=x.shape[1])[:, :, -seq_len:]
    return (F.silu(out) if activation == "silu" else out).to(x.dtype)


def conv_decode(batch: int) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    from causal_conv1d import causal_conv1d_update

    x = torch.randn(batch, CONV_DIM, device="cuda", dtype=DTYPE)
    state = torch.randn(batch, CONV_DIM, CONV_WIDTH, device="cuda", dtype=DTYPE)  # both keep `width` columns
    w = torch.randn(CONV_DIM, CONV_WIDTH, device="cuda", dtype=DTYPE)

    def kernel() -> Any:
        return causal_conv1d_update(x, state, w, None, "silu")

    def fallback() -> Any:
        return torch_causal_conv1d_update(x.unsqueeze(-1), state, w, None, "silu")

    return kernel, fallback, nbytes(x, w, x) + 2 * nbytes(state)


def _gdr_inputs(batch: int, seqlen: int, with_state: bool) -> dict[str, torch.Tensor | None]:
    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE)

    a_coef = torch.empty(V_HEADS, device="cuda").uniform_(0.01, 16)
    return {
        "q": rnd(batch, seqlen, V_HEADS, HEAD_DIM), "k": rnd(batch, seqlen, V_HEADS, HEAD_DIM),
        "v": rnd(batch, seqlen, V_HEADS, HEAD_DIM),
        "g": -a_coef * F.softplus(torch.randn(batch, seqlen, V_HEADS, device="cuda") + 1.0),
        "beta": rnd(batch, seqlen, V_HEADS).sigmoid(),
        "h0": torch.randn(batch, V_HEADS, HEAD_DIM, HEAD_DIM, device="cuda") if with_state else None,
    }


def torch_path(fn: Callable[..., Any]) -> Callable[..., Any]:
    """transformers >= 5.15 wraps its torch_* functions in use_kernel_func_from_hub_with_fallback, which calls the
    installed package (fla) instead: with our wheel installed, the name is the kernel. The torch body is what the
    wrapper wraps (functools.wraps' __wrapped__); refuse to benchmark anything else."""
    body = inspect.unwrap(fn)
    if "fla" in (getattr(body, "__module__", "") or "").split(".")[0]:
        raise RuntimeError(f"{fn.__name__} resolves to {body.__module__}, not transformers' torch code")
    return body


def hopper_refusal() -> str | None:
    """fla-core >= 0.5.2 refuses the gated chunk backward on Hopper with Triton 3.4-3.7.0 (upstream #640); on the
    H200 that call has also been followed by an illegal memory access, so it is not attempted there."""
    import triton
    from packaging.version import Version

    if torch.cuda.get_device_capability(0)[0] == 9 and Version("3.4") <= Version(triton.__version__) < Version("3.7.1"):
        return f"not run: fla refuses the gated chunk backward on Hopper with Triton {triton.__version__} (#640)"
    return None


def gdr_chunk(batch: int, seqlen: int, backward: bool) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    if backward and hopper_refusal():
        raise RuntimeError(hopper_refusal())
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as wrapped

    torch_chunk_gated_delta_rule = torch_path(wrapped)

    x = _gdr_inputs(batch, seqlen, with_state=False)
    leaves = {n: t.detach().clone().requires_grad_(backward) for n, t in x.items() if t is not None}
    do = torch.randn_like(x["v"])  # type: ignore[arg-type]

    def run(fn: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> Any:
            with torch.set_grad_enabled(backward):
                o, _ = fn(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"], beta=leaves["beta"],
                          use_qk_l2norm_in_kernel=True)
                if backward:
                    o.backward(do)
            return o
        return call

    io = nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], x["v"])
    def fallback(q: Any, k: Any, v: Any, g: Any, beta: Any, **kw: Any) -> Any:  # transformers' argument names
        return torch_chunk_gated_delta_rule(q, k, v, g, beta, **kw)

    return run(chunk_gated_delta_rule), run(fallback), \
        (2 * io if backward else io)


def gdr_decode(batch: int) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as wrapped

    torch_recurrent_gated_delta_rule = torch_path(wrapped)

    x = _gdr_inputs(batch, 1, with_state=True)

    def kernel() -> Any:
        return fused_recurrent_gated_delta_rule(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
                                                initial_state=x["h0"], output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)

    def fallback() -> Any:
        return torch_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)

    return kernel, fallback, nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], x["v"]) + 2 * nbytes(x["h0"])


ROWS: list[tuple[str, str, Callable[[], tuple[Callable[[], Any], Callable[[], Any], int]]]] = [
    ("causal-conv1d", "prefill fwd B1 L4096 D8192 W4 silu", lambda: conv_prefill(1, 4096)),
    ("causal-conv1d", "prefill fwd B8 L4096 D8192 W4 silu", lambda: conv_prefill(8, 4096)),
    ("causal-conv1d", "decode update B64 D8192 W4 silu", lambda: conv_decode(64)),
    ("fla-core", "chunk fwd B1 T4096 H32 D128", lambda: gdr_chunk(1, 4096, backward=False)),
    ("fla-core", "chunk fwd B8 T4096 H32 D128", lambda: gdr_chunk(8, 4096, backward=False)),
    ("fla-core", "chunk fwd+bwd B1 T4096 H32 D128", lambda: gdr_chunk(1, 4096, backward=True)),
    ("fla-core", "fused_recurrent decode B32 T1 H32 D128 state in/out", lambda: gdr_decode(32)),
]


def measure(name: str, make: Callable[[], tuple[Callable[[], Any], Callable[[], Any], int]], repeats: int,
            copy_gbps: float) -> dict[str, Any]:
    """One row: kernel and fallback time, speedup, bandwidth, peak memory; an error is recorded, not raised."""
    try:
        kernel, fallback, io_bytes = make()
        k = repeated(kernel, repeats, iters=30)
        f = repeated(fallback, repeats, iters=5)
        gbps = io_bytes / (k["ms"] * 1e-3) / 1e9
        return {"kernel": k, "fallback": f, "speedup": f["ms"] / k["ms"], "bytes": io_bytes, "kernel_gbps": gbps,
                "fraction_of_copy": gbps / copy_gbps, "kernel_peak_bytes": peak_bytes(kernel),
                "fallback_peak_bytes": peak_bytes(fallback)}
    except Exception as exc:  # noqa: BLE001
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:400],
                "traceback": traceback.format_exc()[-1500:]}
    finally:
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001  (a sticky CUDA error ends the run below)
            pass


def versions() -> dict[str, str | None]:
    import importlib.metadata as md

    found = {}
    for dist in ("torch", "triton", "causal-conv1d", "fla-core", "transformers"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the rows whose package or name contains this")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU visible to torch")
        return 3
    torch.manual_seed(0)
    copy = copy_bandwidth(args.repeats)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "gpu": torch.cuda.get_device_name(0), "host": platform.node(),
                              "versions": versions(), "repeats": args.repeats, "copy": copy, "rows": []}
    print(f"copy bandwidth: {copy['gbps']:.0f} GB/s ({report['gpu']})", flush=True)
    for package, name, make in ROWS:
        if args.only not in f"{package} {name}":
            continue
        row = {"package": package, "name": name, **measure(name, make, args.repeats, copy["gbps"])}
        report["rows"].append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")  # after every row: a crash keeps what was measured
        if "error" in row:
            print(f"{package} {name}: {row['error']}", flush=True)
        else:
            print(f"{package} {name}: kernel {row['kernel']['ms']:.4f} ms, fallback {row['fallback']['ms']:.3f} ms, "
                  f"x{row['speedup']:.1f}, {row['kernel_gbps']:.0f} GB/s = {100 * row['fraction_of_copy']:.0f}% "
                  f"of copy", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
