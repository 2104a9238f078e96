"""Does transformers' attn_implementation="flash_attention_2" load and use the flash-attn in this environment?

A tiny random Llama (head dim 128, GQA, no download) runs the same batch with "sdpa" and with "flash_attention_2"
(left padding in one row, so transformers' varlen path runs too); the logits of real tokens must agree, and the
wheel's flash_attn_2_cuda entry points must have been called. Exit 0 only then. On a machine without a GPU it
says so and exits 3 (nothing checked).

    python3 scripts/transformers-fa2-check.py
"""

from __future__ import annotations

import sys
from collections import Counter
from importlib import metadata

import torch


def main() -> int:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import is_flash_attn_2_available

    try:
        dist = metadata.version("flash_attn")
    except metadata.PackageNotFoundError:
        dist = "not installed"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, flash_attn {dist}, "
          f"is_flash_attn_2_available() = {is_flash_attn_2_available()}")
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU here (flash_attention_2 needs one)")
        return 3
    import flash_attn_2_cuda

    calls: Counter[str] = Counter()
    for name in ("fwd", "varlen_fwd"):
        real = getattr(flash_attn_2_cuda, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(flash_attn_2_cuda, name, counted)

    cfg = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 1000, (2, 200), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding: the varlen path
    logits = {}
    for impl in ("sdpa", "flash_attention_2"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits.float()
    real = mask.bool()
    err = (logits["sdpa"] - logits["flash_attention_2"])[real].abs().max().item()
    scale = logits["sdpa"][real].abs().max().item()
    print(f"config attn_implementation: {model.config._attn_implementation}; flash_attn_2_cuda calls: "
          f"{dict(calls)}; max |sdpa - fa2| on real tokens {err:.4g} (logits up to {scale:.3g})")
    ok = sum(calls.values()) > 0 and err <= 0.02 * max(scale, 1.0)
    print("flash_attention_2 check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
