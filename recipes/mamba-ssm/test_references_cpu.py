"""CPU checks of the mamba-ssm kernel tests' own references and of the suite's plumbing (no GPU, no mamba-ssm).

The references are checked against each other where they are independent algorithms (the SSD recurrence
against the chunked form, the scan against a closed-form sum, decode steps chained against the scans). The
case runners are exercised with the references standing in for the package's kernels (there is no GPU
here): they must pass, and a planted bug must fail them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")
import torch.nn.functional as F  # noqa: E402 (after importorskip: no torch, no test)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_harness"))
import kernel_harness as kh  # noqa: E402 (the shared harness beside the recipes)

kt = kh.load_suite(HERE / "kernel_tests.py", "mamba_ssm_kernel_tests")

CPU = torch.device("cpu")


def closed_form_scan(u, delta, A, B, C, D, z, delta_bias, softplus):
    """y_t = sum_{s<=t} <C_t, exp((cum_t - cum_s) A) dt_s u_s B_s>, vectorised over (t, s): no recurrence."""
    dt = delta.double() + (delta_bias.double()[:, None] if delta_bias is not None else 0)
    dt = F.softplus(dt) if softplus else dt
    cum = torch.cumsum(dt, dim=-1)  # (b, d, L)
    diff = cum[..., :, None] - cum[..., None, :]  # (b, d, t, s)
    mask = torch.ones(u.shape[-1], u.shape[-1], dtype=torch.bool).tril()
    decay = torch.exp(diff[..., None] * A.double()[:, None, None, :]) * mask[..., None]  # (b, d, t, s, n)
    Bd, Cd = B.double(), C.double()  # (b, n, L)
    y = torch.einsum("bdtsn,bds,bds,bns,bnt->bdt", decay, dt, u.double(), Bd, Cd)
    if D is not None:
        y = y + D.double()[:, None] * u.double()
    if z is not None:
        y = y * F.silu(z.double())
    return y


@pytest.mark.parametrize("softplus", [False, True])
def test_scan_matches_closed_form(softplus: bool) -> None:
    torch.manual_seed(0)
    b, d, n, L = 2, 3, 4, 9
    u, delta, z = torch.randn(b, d, L), 0.5 * torch.rand(b, d, L), torch.randn(b, d, L)
    A, B, C = -0.5 * torch.rand(d, n), torch.randn(b, n, L), torch.randn(b, n, L)
    D, bias = torch.randn(d), 0.5 * torch.rand(d)
    ours, last = kt.ref_selective_scan(u, delta, A, B, C, D, z, bias, softplus, return_last_state=True)
    want = closed_form_scan(u, delta, A, B, C, D, z, bias, softplus)
    assert torch.allclose(ours.double(), want, rtol=1e-5, atol=1e-5)
    assert last.shape == (b, d, n)


def test_scan_groups_equal_expanded_channels() -> None:
    torch.manual_seed(1)
    b, d, n, L, G = 2, 4, 3, 7, 2
    u, delta = torch.randn(b, d, L), torch.rand(b, d, L)
    A, B, C = -torch.rand(d, n), torch.randn(b, G, n, L), torch.randn(b, G, n, L)
    grouped = kt.ref_selective_scan(u, delta, A, B, C)
    for c in range(d):  # channel c uses group c // (d // G): run it alone with that group's B, C
        g = c // (d // G)
        alone = kt.ref_selective_scan(u[:, c:c + 1], delta[:, c:c + 1], A[c:c + 1], B[:, g], C[:, g])
        assert torch.allclose(grouped[:, c:c + 1], alone, atol=1e-6)


def test_decode_steps_chain_to_the_scan() -> None:
    """selective_state_update applied L times from a zero state gives the scan's outputs and last state."""
    torch.manual_seed(2)
    b, d, n, L = 2, 5, 4, 6
    u, delta, z = torch.randn(b, d, L), torch.randn(b, d, L), torch.randn(b, d, L)
    A, B, C, D, bias = -torch.rand(d, n) - 1, torch.randn(b, n, L), torch.randn(b, n, L), torch.randn(d), torch.rand(d)
    scan, last = kt.ref_selective_scan(u, delta, A, B, C, D, z, bias, True, return_last_state=True)
    state = torch.zeros(b, d, n)
    steps = [kt.ref_selective_state_update(state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D=D,
                                           z=z[..., t], dt_bias=bias, dt_softplus=True) for t in range(L)]
    assert torch.allclose(torch.stack(steps, -1), scan, atol=1e-5)
    assert torch.allclose(state, last, atol=1e-5)


def _ssd_inputs(b=2, T=45, h=4, p=3, n=5, g=2, seed=3):
    torch.manual_seed(seed)
    return {"x": torch.randn(b, T, h, p), "dt": torch.randn(b, T, h) - 2, "A": -torch.rand(h) * 4,
            "B": torch.randn(b, T, g, n), "C": torch.randn(b, T, g, n), "D": torch.randn(h, p),
            "z": torch.randn(b, T, h, p), "dt_bias": torch.rand(h), "initial_states": torch.randn(b, h, p, n)}


@pytest.mark.parametrize("chunk", [8, 16, 45, 64])
def test_ssd_recurrence_equals_chunked(chunk: int) -> None:
    """Two independent SSD algorithms (token recurrence; chunked quadratic + inter-chunk states) agree, also
    with a ragged last chunk, groups, D per channel, z, an initial state and dt_limit."""
    t = _ssd_inputs()
    rec, rec_final = kt.ref_ssd_recurrent(**t, dt_softplus=True, dt_limit=(0.01, 0.5))
    chk, chk_final = kt.ref_ssd_chunked(chunk_size=chunk, **t, dt_softplus=True, dt_limit=(0.01, 0.5))
    assert torch.allclose(rec, chk, rtol=1e-4, atol=1e-4)
    assert torch.allclose(rec_final, chk_final, rtol=1e-4, atol=1e-4)


def test_mamba2_decode_steps_chain_to_the_ssd() -> None:
    """Mamba-2's decode step (heads, dt/A/D tied over the head dim) chained over T equals the SSD recurrence."""
    t = _ssd_inputs(T=7, g=1)
    b, T, h, p = t["x"].shape
    n = t["B"].shape[-1]
    state = t["initial_states"].clone()
    outs = []
    for i in range(T):
        outs.append(kt.ref_selective_state_update(
            state, t["x"][:, i], t["dt"][:, i, :, None].expand(b, h, p), t["A"][:, None, None].expand(h, p, n),
            t["B"][:, i], t["C"][:, i], D=t["D"], z=t["z"][:, i], dt_bias=t["dt_bias"][:, None].expand(h, p),
            dt_softplus=True))
    rec, final = kt.ref_ssd_recurrent(**t, dt_softplus=True)
    assert torch.allclose(torch.stack(outs, 1), rec, atol=1e-5)
    assert torch.allclose(state, final, atol=1e-5)


def test_state_update_indices_touch_only_their_rows() -> None:
    torch.manual_seed(4)
    state = torch.randn(10, 3, 2)
    before = state.clone()
    idx = torch.tensor([7, 2], dtype=torch.int32)
    kt.ref_selective_state_update(state, torch.randn(2, 3), torch.randn(2, 3), -torch.rand(3, 2), torch.randn(2, 2),
                                  torch.randn(2, 2), state_batch_indices=idx)
    changed = (state != before).any(-1).any(-1)
    assert changed.nonzero().flatten().tolist() == [2, 7]


def _reference_api(break_softplus: bool = False) -> Any:
    """The references standing in for the package's kernels (no GPU here); optionally with a planted bug."""
    def scan(*args, delta_softplus=False, **kw):
        return kt.ref_selective_scan(*args, delta_softplus=delta_softplus and not break_softplus, **kw)

    def chunk_scan(x, dt, A, B, C, chunk_size, return_final_states=False, **kw):
        out, final = kt.ref_ssd_chunked(x, dt, A, B, C, chunk_size, **kw)
        return (out.to(x.dtype), final) if return_final_states else out.to(x.dtype)

    return kt.Api(scan=scan, update=kt.ref_selective_state_update, chunk_scan=chunk_scan)


SMALL_CASES = [kt.ScanCase("fp32", "all", seqlen=16), kt.ScanCase("bf16", "none", seqlen=12, groups=2),
               kt.ScanCase("fp16", "zD_softplus", dim=8, dstate=4, seqlen=10, real=True),
               kt.UpdateCase("fp32", "heads_tied", True, dim=128, dstate=8, ngroups=2),
               kt.UpdateCase("bf16", "indices", False, dim=64, dstate=8, batch=3),
               kt.SsdCase("fp32", True, seqlen=40, nheads=2, headdim=8, dstate=4, chunk_size=16),
               kt.SsdCase("bf16", False, seqlen=33, nheads=4, headdim=4, dstate=4, ngroups=2, chunk_size=8)]


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: c.name)
def test_case_runner_passes_with_reference_kernels(case: Any) -> None:
    suite = kt.MambaSuite()
    torch.manual_seed(5)
    [result] = suite.run_one(_reference_api(), case, CPU)
    assert result.status == "passed", result.detail
    assert result.worst is not None and result.worst < 1


def test_case_runner_catches_a_planted_bug() -> None:
    suite = kt.MambaSuite()
    torch.manual_seed(6)
    [result] = suite.run_one(_reference_api(break_softplus=True), kt.ScanCase("fp32", "all", seqlen=16), CPU)
    assert result.status == "failed"
    assert "out FAIL" in result.detail


def test_case_counts_and_unique_names() -> None:
    full, quick = kt.build_cases(False), kt.build_cases(True)
    assert (len(full), len(quick)) == (84, 12)
    assert len({c.name for c in full}) == len(full)
    assert {c.dtype for c in full} == {"fp32", "fp16", "bf16"}


def test_suite_without_gpu_is_skipped_with_a_report(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, str(HERE / "kernel_tests.py"), "--out", str(out), "--quick"],
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 3, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["status"] == "skipped" and report["reason"] == "no CUDA GPU visible to torch"
    assert report["package"] == "mamba-ssm"
