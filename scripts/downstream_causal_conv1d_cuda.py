"""What downstream code and install scripts do with causal-conv1d's compiled module, run against an installed wheel:
`import causal_conv1d_cuda` and call its functions by their old names and argument order (the stable-ABI wheel
keeps that module as a thin layer over torch.ops). Compared with a torch reference; exit 1 on a mismatch."""

import sys

import causal_conv1d_cuda
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
batch, dim, seqlen, width = 2, 64, 256, 4
x = torch.randn(batch, dim, seqlen, device=dev)
w = torch.randn(dim, width, device=dev)
b = torch.randn(dim, device=dev)
out = torch.empty_like(x)
causal_conv1d_cuda.causal_conv1d_fwd(x, w, b, None, None, out, None, True)
ref = F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=width - 1, groups=dim)[..., :seqlen])
fwd_err = (out - ref).abs().max().item()

state = torch.randn(batch, dim, width - 1, device=dev)
xs = torch.randn(batch, dim, 1, device=dev)
out1 = torch.empty_like(xs)
window = torch.cat([state, xs], dim=-1)
causal_conv1d_cuda.causal_conv1d_update(xs, state, w, b, out1, True, None, None)
ref1 = F.silu((window * w).sum(-1, keepdim=True) + b[:, None])
upd_err = (out1 - ref1).abs().max().item()

print(f"module: {causal_conv1d_cuda.__file__}")
print(f"causal_conv1d_fwd max abs diff vs torch: {fwd_err:.2e}; causal_conv1d_update: {upd_err:.2e}")
sys.exit(0 if fwd_err < 1e-4 and upd_err < 1e-4 else 1)
