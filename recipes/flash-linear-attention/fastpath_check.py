#!/usr/bin/env python3
"""Qwen3-Next fast-path check: does transformers really run fla's (and causal-conv1d's) kernels, and do they agree
with transformers' own pure-torch fallback?

Run in a venv that holds our fla-core / flash-linear-attention wheels, transformers, torch and (for the full check)
our causal-conv1d wheel, on a machine with an NVIDIA GPU:

    python fastpath_check.py --out RESULT.json [--quick] [--no-bench] [--seed N]

It wraps fla.ops.gated_delta_rule.{chunk,fused_recurrent}_gated_delta_rule and causal_conv1d.{causal_conv1d_fn,
causal_conv1d_update} in counting spies *before* transformers imports them, then builds a tiny randomly initialised
Qwen3NextForCausalLM (no download; 3 linear-attention layers + 1 full-attention layer, the real 128-wide GDN heads,
2 key heads / 4 value heads), and in bf16 on the GPU:

1. records how transformers resolved the four functions: up to 5.14 module-level names imported at import time
   (None when missing, plus `is_fast_path_available`); from 5.15 `use_kernel_func_from_hub_with_fallback` wrappers
   whose closure holds the chosen implementation (hub kernel if kernelized, else the installed package, else torch);
2. runs a prefill (chunk kernel + causal_conv1d_fn) and three cached decode steps (fused_recurrent +
   causal_conv1d_update) and requires each spy to have been called;
3. captures warnings and transformers log records; a "fast path is not available" / "falling back to its reference
   PyTorch implementation" message about an installed package fails the check;
4. forces the torch fallback (module-level names or layer attributes set to transformers' torch functions, fla's
   fused gated RMSNorm swapped for transformers' torch one) and checks that no spy runs; then compares, with
   upstream's ratio RMS(fast - torch) / RMS(torch): each linear-attention layer run alone on the same hidden states
   (below 0.02), and the logits of the prefill and of each decode step (below 0.03; bf16 end to end).

causal-conv1d missing from the venv (the builder's test venv holds only the wheel under test and its dependencies)
turns its cases into skips with the reason; the fla cases still run. Exit code: 0 passed, 1 failed, 3 skipped.
--device cpu is for developing this script with CPU stand-ins of the kernels only.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.metadata
import logging
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # test fla's Triton kernels, not optional backends
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub; never wait on a network

import torch

try:
    import kernel_harness as kh  # on PYTHONPATH when the builder runs the check
except ImportError:  # run in place from a checkout or an unpacked recipes/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "_harness"))
    import kernel_harness as kh
MODELING = "transformers.models.qwen3_next.modeling_qwen3_next"
# bf16 model; upstream's error ratio RMS(fast - torch) / RMS(torch). A linear-attention layer on identical inputs:
# CPU stand-ins that compute exactly what the torch fallback computes, but in fp32 where it rounds to bf16
# (causal conv), already give ~0.006; logits after 4 layers ~0.01. A wrong kernel gives O(0.1..1).
LAYER_TOL = 0.02
LOGITS_TOL = 0.03
FALLBACK_PATTERNS = ("fast path is not available", "falling back to its reference pytorch implementation",
                     "falling back to torch implementation")

# (package import name, attribute, transformers' name for the function, the path it runs on)
KERNELS: Tuple[Tuple[str, str, str, str], ...] = (
    ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "chunk_gated_delta_rule", "prefill"),
    ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule", "recurrent_gated_delta_rule", "decode"),
    ("causal_conv1d", "causal_conv1d_fn", "causal_conv1d_fn", "prefill"),
    ("causal_conv1d", "causal_conv1d_update", "causal_conv1d_update", "decode"),
)
DISTRIBUTION = {"fla.ops.gated_delta_rule": "flash-linear-attention / fla-core", "causal_conv1d": "causal-conv1d"}
PACKAGE_WORDS = {"fla.ops.gated_delta_rule": ("flash-linear-attention", "flash_linear_attention", "gated_delta_rule",
                                              "`fla`"),
                 "causal_conv1d": ("causal-conv1d", "causal_conv1d")}
# transformers >= 5.15: the module-level wrapper of each kernel; <= 5.14: the module-level import, the layer
# attribute that holds it, and the torch function the layer falls back to.
HUB_STYLE_NAMES = {"chunk_gated_delta_rule": "torch_chunk_gated_delta_rule",
                   "recurrent_gated_delta_rule": "torch_recurrent_gated_delta_rule",
                   "causal_conv1d_fn": "causal_conv1d_fn", "causal_conv1d_update": "causal_conv1d_update"}
FLAG_STYLE = {  # transformers name: (module-level import, layer attribute, torch replacement or None)
    "chunk_gated_delta_rule": ("chunk_gated_delta_rule", "chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    "recurrent_gated_delta_rule": ("fused_recurrent_gated_delta_rule", "recurrent_gated_delta_rule",
                                   "torch_recurrent_gated_delta_rule"),
    "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d_fn", None),
    "causal_conv1d_update": ("causal_conv1d_update", "causal_conv1d_update", "torch_causal_conv1d_update"),
}

# Every expert is active (top-4 of 4): with top-k < experts, rounding-level differences flip the router's choice on
# near-tied random weights and the logits jump, which says nothing about the kernels.
CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
              num_experts=4, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=128,
              decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096, rms_norm_eps=1e-6,
              tie_word_embeddings=False, initializer_range=0.02)


# --------------------------------------------------------------------------- spies and captured messages


@dataclass
class SpyRecord:
    """One wrapped package function and how often it ran."""

    module: str
    attr: str
    name: str
    path: str
    installed: bool = False
    import_error: str = ""
    calls: int = 0
    wrapper: Optional[Callable[..., Any]] = None
    original: Optional[Callable[..., Any]] = None


def install_spies() -> Dict[str, SpyRecord]:
    """Replace each package function by a counting wrapper (same signature via __wrapped__), keyed by
    transformers' name for it. Must run before transformers' Qwen3-Next module is imported."""
    spies: Dict[str, SpyRecord] = {}
    for module_name, attr, name, path in KERNELS:
        record = SpyRecord(module_name, attr, name, path)
        spies[name] = record
        try:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
        except Exception as exc:  # noqa: BLE001  (missing package, or one that does not import)
            record.import_error = kh.short_error(exc)
            continue

        def make(rec: SpyRecord, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def spy(*args: Any, **kwargs: Any) -> Any:
                rec.calls += 1
                return fn(*args, **kwargs)

            spy._fastpath_spy = rec  # type: ignore[attr-defined]
            return spy

        record.installed, record.original = True, original
        record.wrapper = make(record, original)
        setattr(module, attr, record.wrapper)
    return spies


class Messages(logging.Handler):
    """Collects transformers' log records and Python warnings."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: List[Dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"source": record.name, "level": record.levelname, "message": record.getMessage()})

    def add_warnings(self, caught: Sequence[warnings.WarningMessage]) -> None:
        for w in caught:
            self.records.append({"source": f"warnings:{w.category.__name__}", "level": "WARNING",
                                 "message": str(w.message)})

    def fallback_messages(self) -> List[str]:
        return [r["message"] for r in self.records if any(p in r["message"].lower() for p in FALLBACK_PATTERNS)]


# --------------------------------------------------------------------------- how transformers resolved each kernel


def _inner(fn: Any) -> Any:
    """What fn wraps: functools.wraps' __wrapped__, or, for the nn.Module that the `kernels` package makes of a
    function decorated with use_kernel_forward_from_hub, the function its forward calls."""
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        return wrapped
    forward = getattr(type(fn), "forward", None)
    if isinstance(fn, torch.nn.Module) and getattr(forward, "__closure__", None):
        cells = dict(zip(forward.__code__.co_freevars, (c.cell_contents for c in forward.__closure__), strict=True))
        return cells.get("func")
    return None


def _fallback_wrapper(fn: Any) -> Tuple[Dict[str, Any], Any]:
    """(free variables, function) of transformers' use_kernel_func_from_hub_with_fallback wrapper found in or under
    fn; ({}, None) if there is none."""
    for _ in range(10):
        if fn is None:
            break
        code = getattr(fn, "__code__", None)
        if code is not None and getattr(fn, "__closure__", None):
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__), strict=True))
            if "implementation" in cells:
                return cells, fn
        fn = _inner(fn)
    return {}, None


def _closure(fn: Any) -> Dict[str, Any]:
    return _fallback_wrapper(fn)[0]


def _describe(obj: Any, spies: Dict[str, SpyRecord]) -> str:
    rec = getattr(obj, "_fastpath_spy", None)
    if rec is not None:
        return f"installed package ({rec.module}.{rec.attr})"
    if obj is None:
        return "None"
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def resolution(mq: Any, spies: Dict[str, SpyRecord]) -> Dict[str, Any]:
    """Which implementation transformers picked for each kernel, without running anything."""
    if hasattr(mq, "is_fast_path_available"):
        out: Dict[str, Any] = {"style": "module-level imports (transformers <= 5.14)",
                               "is_fast_path_available": bool(mq.is_fast_path_available)}
        for name, (module_attr, _, _) in FLAG_STYLE.items():
            obj = getattr(mq, module_attr, None)
            out[name] = {"resolved": _describe(obj, spies), "uses_package": getattr(obj, "_fastpath_spy", None)
                         is not None}
        return out
    out = {"style": "use_kernel_func_from_hub_with_fallback (transformers >= 5.15)"}
    for name, module_attr in HUB_STYLE_NAMES.items():
        cells = _closure(getattr(mq, module_attr, None))
        impl = cells.get("implementation")
        out[name] = {"resolved": _describe(impl, spies) if cells else "unknown (no fallback wrapper found)",
                     "uses_package": getattr(impl, "_fastpath_spy", None) is not None,
                     "requested": cells.get("func_name")}
    return out


@contextlib.contextmanager
def forced_fallback(mq: Any, model: Any) -> Iterator[List[str]]:
    """Make the model take transformers' pure-torch path; yields what was switched; restores on exit."""
    changes: List[Tuple[Any, str, Any]] = []
    switched: List[str] = []

    def swap(obj: Any, attr: str, value: Any) -> None:
        changes.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    try:
        if hasattr(mq, "is_fast_path_available"):  # <= 5.14: the layers hold the functions
            torch_norm = mq.Qwen3NextRMSNormGated
            for layer in gdn_layers(model):
                for _, layer_attr, torch_name in FLAG_STYLE.values():
                    if hasattr(layer, layer_attr):
                        swap(layer, layer_attr, getattr(mq, torch_name) if torch_name else None)
                        switched.append(f"{type(layer).__name__}.{layer_attr}")
                norm = getattr(layer, "norm", None)
                if norm is not None and not isinstance(norm, torch_norm):
                    replacement = torch_norm(layer.head_v_dim, eps=layer.layer_norm_epsilon)
                    replacement.load_state_dict({"weight": norm.weight.detach().clone()})
                    swap(layer, "norm", replacement.to(device=norm.weight.device, dtype=norm.weight.dtype))
                    switched.append(f"{type(layer).__name__}.norm ({type(norm).__name__} -> {torch_norm.__name__})")
        else:  # >= 5.15: module-level wrappers; the torch function is the one they wrap
            for module_attr in HUB_STYLE_NAMES.values():
                cells, wrapper = _fallback_wrapper(getattr(mq, module_attr, None))
                torch_fn = cells.get("torch_function") or getattr(wrapper, "__wrapped__", None)
                if torch_fn is not None:
                    swap(mq, module_attr, torch_fn)
                    switched.append(f"{MODELING}.{module_attr}")
        yield switched
    finally:
        for obj, attr, value in reversed(changes):
            setattr(obj, attr, value)


def gdn_layers(model: Any) -> List[Any]:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


# --------------------------------------------------------------------------- runs and comparison


@dataclass
class RunOutput:
    prefill_logits: torch.Tensor
    decode_logits: List[torch.Tensor]
    layer_inputs: List[torch.Tensor]
    calls: Dict[str, Dict[str, int]] = field(default_factory=dict)


def run_model(model: Any, input_ids: torch.Tensor, decode_ids: torch.Tensor, spies: Dict[str, SpyRecord]) -> RunOutput:
    """Prefill with a cache, then one token at a time; spy calls counted per phase; the hidden states entering
    each linear-attention layer during the prefill are kept."""
    captured: List[torch.Tensor] = []

    def keep_input(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        captured.append(hidden.detach().clone())

    hooks = [layer.register_forward_pre_hook(keep_input, with_kwargs=True) for layer in gdn_layers(model)]
    calls: Dict[str, Dict[str, int]] = {}
    try:
        before = {n: s.calls for n, s in spies.items()}
        with torch.no_grad():
            out = model(input_ids=input_ids, use_cache=True)
        calls["prefill"] = {n: s.calls - before[n] for n, s in spies.items()}
    finally:
        for hook in hooks:
            hook.remove()
    cache, decode_logits = out.past_key_values, []
    before = {n: s.calls for n, s in spies.items()}
    with torch.no_grad():
        for step in range(decode_ids.shape[1]):
            step_out = model(input_ids=decode_ids[:, step:step + 1], past_key_values=cache, use_cache=True)
            cache = step_out.past_key_values
            decode_logits.append(step_out.logits.detach().float().clone())
    calls["decode"] = {n: s.calls - before[n] for n, s in spies.items()}
    return RunOutput(out.logits.detach().float().clone(), decode_logits, captured, calls)


def run_layers(model: Any, layer_inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """Each linear-attention layer on its own, no cache: the same hidden states in, its output out."""
    with torch.no_grad():
        return [layer(x).detach().float().clone() for layer, x in zip(gdn_layers(model), layer_inputs, strict=False)]


@dataclass
class CaseResult:
    name: str
    status: str
    detail: str = ""
    ratio: Optional[float] = None
    max_abs_err: Optional[float] = None
    tol: Optional[float] = None


def compare(name: str, fast: torch.Tensor, ref: torch.Tensor, tol: float) -> CaseResult:
    if fast.shape != ref.shape:
        return CaseResult(name, "failed", f"shape {tuple(fast.shape)} != {tuple(ref.shape)}")
    bad = int((~torch.isfinite(fast)).sum().item())
    if bad:
        return CaseResult(name, "failed", f"{bad}/{fast.numel()} non-finite values on the fast path", tol=tol)
    ratio, abs_err = kh.err_ratio(fast, ref)
    ok = ratio < tol
    return CaseResult(name, "passed" if ok else "failed", f"ratio {ratio:.2e} (tol {tol}), max abs {abs_err:.3g}",
                      kh.finite_float(ratio), kh.finite_float(abs_err), tol)


# --------------------------------------------------------------------------- the check


def build_model(mq: Any, device: torch.device, seed: int) -> Any:
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(**CONFIG)
    torch.manual_seed(seed)
    model = mq.Qwen3NextForCausalLM(config)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def kernel_cases(spies: Dict[str, SpyRecord], res: Dict[str, Any], fast: RunOutput,
                 messages: Messages) -> List[CaseResult]:
    cases: List[CaseResult] = []
    for name, spy in spies.items():
        pkg = DISTRIBUTION[spy.module]
        if not spy.installed:
            reason = f"{pkg} is not importable here ({spy.import_error})"
            # fla is what this check is about: missing, it fails; causal-conv1d may be absent from the venv.
            status = "failed" if spy.module.startswith("fla") else "skipped"
            cases += [CaseResult(f"resolved/{name}", status, reason), CaseResult(f"ran/{name}", status, reason)]
            continue
        info = res.get(name, {})
        cases.append(CaseResult(f"resolved/{name}", "passed" if info.get("uses_package") else "failed",
                                f"transformers resolved {name} to {info.get('resolved')}"
                                + (f" (it looks up {info['requested']!r})" if info.get("requested") else "")))
        n = fast.calls.get(spy.path, {}).get(name, 0)
        cases.append(CaseResult(f"ran/{name}", "passed" if n else "failed",
                                f"{spy.module}.{spy.attr} called {n} time(s) during the {spy.path} run"))
    if "is_fast_path_available" in res:
        all_installed = all(s.installed for s in spies.values())
        flag = res["is_fast_path_available"]
        cases.append(CaseResult("flag/is_fast_path_available", "passed" if flag == all_installed else "failed",
                                f"is_fast_path_available={flag}; all four kernels importable: {all_installed}"))
    missing = sorted({s.module for s in spies.values() if not s.installed})
    relevant, excused = [], []
    for message in messages.fallback_messages():
        lower = message.lower()
        if any(any(word in lower for word in PACKAGE_WORDS[m]) for m in missing):
            excused.append(message)  # about (or also about) a package this venv does not have
        else:
            relevant.append(message)
    if relevant:
        cases.append(CaseResult("messages/no_fallback_warning", "failed", "; ".join(relevant)[:600]))
    elif excused:
        cases.append(CaseResult("messages/no_fallback_warning", "skipped", "only fallback warnings that name packages "
                                f"not installed here ({', '.join(DISTRIBUTION[m] for m in missing)})"))
    else:
        cases.append(CaseResult("messages/no_fallback_warning", "passed", "no fast-path / fallback warning seen"))
    return cases


def run_check(report: Dict[str, Any], device: torch.device, seed: int, quick: bool) -> None:
    messages = Messages()
    tf_logger = logging.getLogger("transformers")
    tf_logger.addHandler(messages)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        already = MODELING in sys.modules
        spies = install_spies()
        if device.type == "cpu":
            _cpu_availability_for_development(spies)
        try:
            mq = importlib.import_module(MODELING)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (exc.name == MODELING or MODELING.startswith(exc.name + ".")):
                tf_logger.removeHandler(messages)
                report.update(status="skipped", reason=f"transformers {kh.installed_version('transformers') or '(not installed)'} has no Qwen3-Next "
                                                       f"({kh.short_error(exc)})")
                return
            raise
        report["modeling_imported_before_spies"] = already
        res = resolution(mq, spies)
        report["resolution"] = res
        model = build_model(mq, device, seed)
        report["model"] = {"config": CONFIG, "parameters": sum(p.numel() for p in model.parameters()),
                           "linear_attention_layers": len(gdn_layers(model)),
                           "norm": sorted({type(getattr(m, "norm", None)).__name__ for m in gdn_layers(model)})}
        gen = torch.Generator(device="cpu").manual_seed(seed)
        batch, seqlen, steps = (1, 77, 2) if quick else (2, 200, 3)
        input_ids = torch.randint(0, CONFIG["vocab_size"], (batch, seqlen), generator=gen).to(device)
        decode_ids = torch.randint(0, CONFIG["vocab_size"], (batch, steps), generator=gen).to(device)
        report["inputs"] = {"batch": batch, "prefill_tokens": seqlen, "decode_steps": steps}
        fast = run_model(model, input_ids, decode_ids, spies)
        fast_layers = run_layers(model, fast.layer_inputs)
        with forced_fallback(mq, model) as switched:
            report["fallback_switched"] = switched
            slow = run_model(model, input_ids, decode_ids, spies)
            slow_layers = run_layers(model, fast.layer_inputs)
    messages.add_warnings(caught)
    tf_logger.removeHandler(messages)
    report["calls"] = {"fast": fast.calls, "fallback": slow.calls}
    report["messages"] = messages.records[:50]

    cases = kernel_cases(spies, res, fast, messages)
    leaked = {phase: {n: c for n, c in counts.items() if c} for phase, counts in slow.calls.items()}
    leaked = {p: c for p, c in leaked.items() if c}
    cases.append(CaseResult("fallback/no_kernel_calls", "failed" if leaked or not switched else "passed",
                            f"package kernels called on the forced torch path: {leaked}" if leaked else
                            ("nothing could be switched to the torch path" if not switched else
                             f"switched {len(switched)} function(s); no package kernel ran")))
    for i, (a, b) in enumerate(zip(fast_layers, slow_layers, strict=False)):
        cases.append(compare(f"compare/prefill/linear_attn_layer{i}", a, b, LAYER_TOL))
    if not fast_layers or len(fast_layers) != len(gdn_layers(model)):
        cases.append(CaseResult("compare/prefill/linear_attn_layers", "failed",
                                f"compared {len(fast_layers)} of {len(gdn_layers(model))} linear-attention layers"))
    cases.append(compare("compare/prefill/logits", fast.prefill_logits, slow.prefill_logits, LOGITS_TOL))
    for step, (a, b) in enumerate(zip(fast.decode_logits, slow.decode_logits, strict=False)):
        cases.append(compare(f"compare/decode_step{step}/logits", a, b, LOGITS_TOL))
    report["cases"] = [asdict(c) for c in cases]


def _cpu_availability_for_development(spies: Dict[str, SpyRecord]) -> None:
    """--device cpu only: transformers <= 5.14 gates fla/causal-conv1d on CUDA, and 5.25+ sends CPU inputs past the
    installed package to the torch path (hub_kernels._PACKAGE_SUPPORTED_DEVICES); let importability decide, so the
    CPU stand-ins are what the wrappers call."""
    try:
        from transformers.utils import import_utils
    except ImportError:
        return  # reported when the model module fails to import
    have_fla = spies["chunk_gated_delta_rule"].installed
    have_conv = spies["causal_conv1d_fn"].installed
    import_utils.is_flash_linear_attention_available = lambda: have_fla
    import_utils.is_causal_conv1d_available = lambda: have_conv
    try:
        from transformers.integrations import hub_kernels
    except ImportError:
        return
    devices = getattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES", None)
    if isinstance(devices, dict):
        for package, kinds in list(devices.items()):
            devices[package] = (*kinds, "cpu")


# --------------------------------------------------------------------------- report and CLI


def new_report(seed: int, quick: bool, device: str) -> Dict[str, Any]:
    return {"check": "qwen3-next fast path", "versions": {d: kh.installed_version(d) for d in (
        "transformers", "torch", "triton", "fla-core", "flash-linear-attention", "causal-conv1d", "kernels")},
        "device": device, "gpu": None, "capability": None, "seed": seed, "quick": quick,
        "env": {k: os.environ.get(k) for k in ("FLA_DISABLE_BACKEND_DISPATCH", "HF_HUB_OFFLINE", "USE_HUB_KERNELS")},
        "status": None, "reason": "", "counts": {"passed": 0, "failed": 0, "skipped": 0}, "cases": [], "speed": []}


def print_summary(report: Dict[str, Any]) -> None:
    for case in report["cases"]:
        if case["status"] != "passed":
            print(f"{case['status'].upper()} {case['name']}: {case['detail']}")
    if report["reason"]:
        print(f"{report['status']}: {report['reason']}")
    c = report["counts"]
    print(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="where to write the JSON report")
    parser.add_argument("--quick", action="store_true", help="shorter prompt (77 tokens, batch 1, 2 decode steps)")
    parser.add_argument("--no-bench", action="store_true", help="accepted for the builder's runner; no timing here")
    parser.add_argument("--seed", type=int, default=None, help="reuse a recorded seed (default: from the clock)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: only for developing this script with CPU stand-ins of the kernels")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else time.time_ns() % (2**31 - 1)
    report = new_report(seed, args.quick, args.device)
    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            report.update(status="skipped", reason="no CUDA GPU visible to torch")
        else:
            device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
            if device.type == "cuda":
                major, minor = torch.cuda.get_device_capability(device)
                report.update(gpu=torch.cuda.get_device_name(device), capability=f"{major}.{minor}")
            run_check(report, device, seed, args.quick)
    except BaseException as exc:  # noqa: BLE001  (the report must still be written)
        report.update(status="failed", reason=f"harness error: {kh.short_error(exc)}",
                      traceback=traceback.format_exc()[-4000:])
    finally:
        kh.finalize(report)
        kh.write_report(report, args.out)
        print_summary(report)
    return kh.EXIT_CODES[report["status"]]


if __name__ == "__main__":
    sys.exit(main())
