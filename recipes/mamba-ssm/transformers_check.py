"""transformers' Mamba2ForCausalLM with our mamba-ssm + causal-conv1d wheels: do the CUDA kernels really run, and do
the logits agree with transformers' own torch path?

A tiny random Mamba-2 config (no download). The reference is the same model (same seed, same weights) on the same GPU
in a child process that cannot import the kernel packages (PYTHONPATH, which carries them, removed), so transformers
takes its torch path there; a CPU reference is not possible, because transformers 5.17 binds causal-conv1d's kernel
for CPU tensors too once it is importable ("Expected x.is_cuda() to be true"). The candidate runs with the kernels. Which kernels ran is read from the
CUDA profiler (kernel names launched by causal-conv1d's .so and mamba-ssm's Triton ops), not from what imported.
Prefill (mamba_chunk_scan_combined + causal_conv1d_fn) and greedy decode (selective_state_update +
causal_conv1d_update) are both checked. Writes a JSON report; exit 0 pass, 1 fail, 3 cannot run here (no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys

# kernel-name fragments per library, as the CUDA profiler names them
KERNELS = {
    "causal_conv1d (prefill)": ("causal_conv1d_fwd", "causal_conv1d_channellast_fwd"),
    "causal_conv1d (decode)": ("causal_conv1d_update",),
    "mamba_ssm SSD chunk scan (prefill)": ("_chunk_scan_fwd", "_chunk_state_fwd", "_chunk_cumsum_fwd"),
    "mamba_ssm selective_state_update (decode)": ("_selective_scan_update",),
}
TOLERANCE = 2e-3  # relative RMS of fp32 logits, GPU kernels vs the CPU torch path


def kernels_launched(run) -> list[str]:  # run: a zero-argument callable
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", help=argparse.SUPPRESS)  # internal: write the torch path's outputs here
    args = parser.parse_args()
    report: dict[str, object] = {"check": "transformers Mamba2ForCausalLM, our kernels vs its torch path"}
    import torch

    if not torch.cuda.is_available():
        report.update(status="skipped", reason="no CUDA GPU visible to torch")
        return _finish(report, args.out, 3)
    import transformers
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    config = Mamba2Config(vocab_size=512, hidden_size=256, num_hidden_layers=2, state_size=64, expand=2, head_dim=64,
                          num_heads=8, n_groups=1, chunk_size=64, conv_kernel=4)
    gpu = Mamba2ForCausalLM(config).eval().cuda()
    ids = torch.randint(0, config.vocab_size, (2, 192))
    if args.reference:  # the child: transformers' torch path, no kernel package importable
        with torch.no_grad():
            torch.save({"logits": gpu(ids.cuda()).logits.double().cpu(),
                        "tokens": gpu.generate(ids[:, :32].cuda(), max_new_tokens=6, do_sample=False).cpu(),
                        "kernels": kernels_launched(lambda: gpu(ids.cuda()))}, args.reference)
        return 0
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ref_file = os.path.join(tmp, "reference.pt")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        child = subprocess.run([sys.executable, __file__, "--out", os.devnull, "--reference", ref_file], env=env,
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            report.update(status="failed", reason=f"reference run failed: {child.stderr.strip()[-800:]}")
            return _finish(report, args.out, 1)
        ref = torch.load(ref_file)
    reference, ref_tokens = ref["logits"], ref["tokens"]
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        prefill = kernels_launched(lambda: out.__setitem__("logits", gpu(ids.cuda()).logits))
        decode = kernels_launched(lambda: out.__setitem__("tokens", gpu.generate(ids[:, :32].cuda(), max_new_tokens=6,
                                                                                  do_sample=False)))
    logits = out["logits"].double().cpu()
    rel = float((logits - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt())
    found = {name: sorted(k for k in (prefill if "prefill" in name else decode) if any(f in k for f in fragments))
             for name, fragments in KERNELS.items()}
    tokens_equal = bool(torch.equal(out["tokens"].cpu(), ref_tokens))
    ref_used_kernels = [k for k in ref["kernels"] if any(f in k for fr in KERNELS.values() for f in fr)]
    ok = all(found.values()) and rel < TOLERANCE and tokens_equal and not ref_used_kernels
    import causal_conv1d
    import mamba_ssm

    report.update(
        status="passed" if ok else "failed",
        gpu=torch.cuda.get_device_name(0), torch=torch.__version__, transformers=transformers.__version__,
        mamba_ssm=getattr(mamba_ssm, "__version__", "?"), mamba_ssm_file=mamba_ssm.__file__,
        causal_conv1d=getattr(causal_conv1d, "__version__", "?"), causal_conv1d_file=causal_conv1d.__file__,
        logits_relative_rms=rel, tolerance=TOLERANCE, greedy_tokens_equal=tokens_equal,
        kernels_that_ran={k: v[:4] for k, v in found.items()},
        missing=[k for k, v in found.items() if not v],
        reference_kernels_of_these_libraries=[k for k in ref["kernels"] if any(
            f in k for fragments in KERNELS.values() for f in fragments)],  # must be empty: the torch path
    )
    return _finish(report, args.out, 0 if ok else 1)


def _finish(report: dict[str, object], out: str, code: int) -> int:
    with open(out, "w") as fh:
        json.dump(report, fh, indent=2)
    print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
