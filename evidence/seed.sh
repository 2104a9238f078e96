#!/usr/bin/env bash
# How evidence/gpu-runs.json was first made (issue 53 item 4): one scripts/evidence-add.py call per GPU run of
# docs/GPU-RESULTS.md sections 1-20, its numbers read from the raw file at commit $C (HEAD when the entries were
# made; the files left the tree in d9c1d7d, and its parent 2658b8e still holds the same bytes). Rerunning it rewrites the same entries. A new GPU run adds its own line
# (scripts/evidence-add.py --report ... after its report is committed), not a line here.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-d18e93908709d1e7cc888d69d1becc607c4c4ad2}
G=docs/gpu-results
add() { python3 scripts/evidence-add.py --commit "$C" "$@"; }
CC124=causal_conv1d-1.7.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl
CCS=causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl
MSS=mamba_ssm-2.3.2.post1+cu13-cp310-abi3-linux_x86_64.whl
FA=flash_attn-2.8.3.post2+cu13torch2.11-cp312-cp312-linux_x86_64.whl
T='builder test WHEEL --python python3 --require-kernel-tests'

# sections 1-3 (2026-11-29, H200): the farm's flow, the builder on the GPU machine, a planted fault
add --id s01-test-good --date 2026-11-29 --section 1 --wheel $CC124 --command "$T --wheelhouse .carry/wh-good" \
    --report $G/h200-staged-causal-conv1d-1.7.0-sm90.json
add --id s02-host-build --date 2026-11-29 --section 2 --wheel $CC124 \
    --command "builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90 --toolchain host --python python3 --offline --source causal_conv1d-1.7.0.tar.gz --require-kernel-tests" \
    --report $G/h200-host-build-causal-conv1d-1.7.0-sm90.json
add --id s03-planted-silu --date 2026-11-29 --section 3 --wheel $CC124 --expect fail \
    --command "$T (wheel built with --test-patch 9001-test-only-break-silu.patch)" --report $G/h200-planted-fault-silu.json
# section 5 (2026-11-29, H200): fla and the transformers fast path; fla-core's kernel suite (session 2)
add --id s05-fla-fastpath --date 2026-11-29 --section 5 --package flash-linear-attention \
    --version 0.6.0+cu130torch2.11 --wheel flash_linear_attention-0.6.0+cu130torch2.11-py3-none-any.whl \
    --command "$T --with fla_core-0.6.0+cu130torch2.11-py3-none-any.whl --with $CC124" \
    --note "the transformers fast-path check (a tiny Qwen3-Next): its 17 checks, not a kernel suite" \
    --report $G/h200-fla-fastpath-qwen3next.json
add --id s05-fla-core --date 2026-11-29 --section 5 --session 2 --wheel fla_core-0.6.0+cu130torch2.11-py3-none-any.whl \
    --command "$T" --note "25 chunk backwards skipped: refused by fla-core itself on Hopper with Triton < 3.7.1 (#640)" \
    --report $G/h200-fla-core-0.6.0-kernel-tests.json
add --id s05-fla-core-guard-lifted --date 2026-11-29 --section 5 --session 2 \
    --wheel fla_core-0.6.0+cu130torch2.11-py3-none-any.whl \
    --command "FLA_TEST_BYPASS_HOPPER_GUARD=1 python3 recipes/fla-core/kernel_tests.py --only '^chunk/bf16/B2/T1000/h16v32/h0\+ht/l2norm_in_kernel/gate_qwen/g_fp32'" \
    --note "an experiment, not a gate: upstream's Hopper guard lifted for one Qwen3-Next training case" \
    --report $G/h200-fla-core-0.6.0-guard-lifted.json
# section 7 (2026-12-01, H200): mamba-ssm; 7a transformers' Mamba2ForCausalLM
add --id s07-mamba --date 2026-12-01 --section 7 --wheel mamba_ssm-2.3.2.post1+cu130torch2.11-cp312-cp312-linux_x86_64.whl \
    --command "$T" --report $G/h200-mamba-ssm-2.3.2.post1-kernel-tests.json
add --id s07a-mamba-transformers --date 2026-12-01 --section 7 --package mamba-ssm --version 2.3.2.post1+cu130torch2.11 \
    --sm sm_90 --command "python3 recipes/mamba-ssm/transformers_check.py --out R.json (with the mamba-ssm and causal-conv1d sm_90 wheels)" \
    --note "transformers Mamba2ForCausalLM vs its torch path: fp32 logits relative RMS 7.8e-4 (bound 2e-3), greedy decode identical" \
    --report $G/h200-mamba-transformers.json
# section 8 (2026-12-02, H200, session 8): the restructured builder
add --id s08-test-good --date 2026-12-02 --section 8 --session 8 --wheel $CC124 --command "$T" \
    --report $G/issue26-session8/test-good-report.json
# section 9 (2026-12-02, H200, session 9): stable-ABI wheels
add --id s09-cc-stable --date 2026-12-02 --section 9 --session 9 --wheel $CCS --command "$T" \
    --report $G/issue25-session9/causal-conv1d-stable-sm90-kernel-tests.json
add --id s09-cc-stable-upstream --date 2026-12-02 --section 9 --session 9 --wheel $CCS --package causal-conv1d \
    --version 1.7.0+cu13 --sm sm_90 --gpu "NVIDIA H200" --torch 2.11.0+cu130 \
    --command "python3 -m pytest tests/test_causal_conv1d.py (upstream's own test file from the 1.7.0 sdist, against the installed wheel)" \
    --prose --status passed --passed 9485 --failed 0 --skipped 3888 --raw $G/issue25-session9/gpu-check-call1.log
add --id s09-mamba-stable --date 2026-12-02 --section 9 --session 9 --wheel $MSS --command "$T --no-bench" \
    --report $G/issue25-session9/mamba-ssm-stable-sm90-kernel-tests.json
add --id s09-mamba2-transformers-stable --date 2026-12-02 --section 9 --session 9 --package mamba-ssm \
    --version 2.3.2.post1+cu13 --sm sm_90 --wheel $MSS \
    --command "python3 recipes/mamba-ssm/transformers_check.py --out R.json (with both stable wheels)" \
    --note "transformers Mamba2ForCausalLM vs its torch path: fp32 logits relative RMS 7.75e-4 (bound 2e-3)" \
    --report $G/issue25-session9/mamba2-transformers-stable-wheels.json
# section 10 (2026-12-02, H200, session 11): wheel variants
add --id s10-plain-quick --date 2026-12-02 --section 10 --session 11 --wheel $CCS --command "builder test WHEEL --quick" \
    --report $G/issue29-session11/plain-builder-test-quick.json
add --id s10-sm90-variant --date 2026-12-02 --section 10 --session 11 \
    --wheel causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm90.whl --command "$T" \
    --report $G/issue29-session11/sm90-variant-builder-test.json
add --id s10-installed-variant --date 2026-12-02 --section 10 --session 11 \
    --wheel causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm90.whl \
    --command "recipes/causal-conv1d/kernel_tests.py --no-bench (against the variant builder install chose)" \
    --report $G/issue29-session11/variant-kernel-tests.json
add --id s10-installed-variant-2 --date 2026-12-02 --section 10 --session 11 \
    --wheel causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm90.whl \
    --command "recipes/causal-conv1d/kernel_tests.py --no-bench (second call, after two fixes)" \
    --report $G/issue29-session11/second-run/variant-kernel-tests.json
# section 11 (2026-12-06, H100, session 12)
add --id s11-cc-stable --date 2026-12-06 --section 11 --session 12 --wheel $CCS --command "$T" \
    --report $G/issue38-39-session12/cc-kernel-tests-summary.json
add --id s11-stable-offline --date 2026-12-06 --section 11 --session 12 --wheel $CCS --package causal-conv1d \
    --version 1.7.0+cu13 --sm sm_90 --gpu "NVIDIA H100 80GB HBM3" --torch 2.11.0+cu130 \
    --command "builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90 --toolchain host --python python3 --offline --source causal_conv1d-1.7.0.tar.gz --require-kernel-tests --quick" \
    --prose --status passed --passed 19 --failed 0 --skipped 0 --raw $G/issue38-39-session12/stable-offline.log
# section 12 (2026-12-06, H100, session 14): torch floor 2.10
add --id s12-cc-floor210 --date 2026-12-06 --section 12 --session 14 --wheel $CCS --command "$T --no-bench" \
    --report $G/issue39-session14/h100-floor210-causal-conv1d-kernel-tests.json
add --id s12-mamba-floor210 --date 2026-12-06 --section 12 --session 14 --wheel $MSS --command "$T --no-bench" \
    --report $G/issue39-session14/h100-floor210-mamba-ssm-kernel-tests.json
# sections 13-15 (2026-12-06, session 15)
add --id s13-cc-per-torch-abi3 --date 2026-12-06 --section 13 --session 15 \
    --wheel causal_conv1d-1.7.0+cu130torch2.11-cp310-abi3-linux_x86_64.whl --command "$T (built by Python 3.11)" \
    --report $G/issue39-session15/abi3-causal_conv1d-causal-conv1d-test-zxcxe6s1.json
add --id s13-cc-per-torch-abi3-gpu-build --date 2026-12-06 --section 13 --session 15 \
    --wheel causal_conv1d-1.7.0+cu130torch2.11-cp310-abi3-linux_x86_64.whl --package causal-conv1d \
    --version 1.7.0+cu130torch2.11 --sm sm_90 --gpu "NVIDIA H100 80GB HBM3" --torch 2.11.0+cu130 \
    --command "builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90 --toolchain host --abi per-torch --torch 2.11.0 --python python3 --offline --require-kernel-tests --quick" \
    --prose --status passed --passed 19 --failed 0 --skipped 0 --raw $G/issue39-session15/gpu-check-build.log
add --id s14-cc-1.6.2-stable --date 2026-12-06 --section 14 --session 15 \
    --wheel causal_conv1d-1.6.2.post1+cu13-cp310-abi3-linux_x86_64.whl --command "$T --no-bench" \
    --note "9 skipped: seq_idx with initial_states needs causal-conv1d >= 1.7.0" \
    --report $G/issue39-session15/stable-1.6.2.post1-kernel-tests.json
add --id s15-mamba-per-torch-abi3 --date 2026-12-06 --section 15 --session 15 \
    --wheel mamba_ssm-2.3.2.post1+cu130torch2.11-cp310-abi3-linux_x86_64.whl --command "$T (built by Python 3.11)" \
    --report $G/issue39-session15/abi3-mamba_ssm-kernel-tests.json
# section 16 (2026-12-06, H200, session 16)
add --id s16-cc-per-torch-major --date 2026-12-06 --section 16 --session 16 \
    --wheel causal_conv1d-1.7.0+cu13torch2.11-cp310-abi3-linux_x86_64.whl --package causal-conv1d \
    --version 1.7.0+cu13torch2.11 --sm sm_90 --gpu "NVIDIA H200" --torch 2.11.0+cu130 \
    --command "builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90 --toolchain host --abi per-torch --torch 2.11.0 --python python3 --offline --require-kernel-tests --quick" \
    --prose --status passed --passed 19 --failed 0 --skipped 0 --raw $G/issue39-session16/gpu-check-per-torch-major.log
add --id s16-mamba-2.3.1-stable --date 2026-12-06 --section 16 --session 16 \
    --wheel mamba_ssm-2.3.1+cu13-cp310-abi3-linux_x86_64.whl --command "$T --no-bench" \
    --report $G/issue39-session16/mamba-2.3.1-stable-kernel-tests.json
# section 17 (2026-12-07, H100, session 17): boundary tests, the sanitizer, two upstream defects
P='scripts/gpu-kernel-proof.sh'
H100=(--sm sm_90 --torch 2.11.0+cu130)
add --id s17-c1-01-fault --date 2026-12-07 --section 17 --session 17 --wheel $CCS --expect fail --package causal-conv1d \
    --version 1.7.0+cu13 "${H100[@]}" --command "$P fail:WHEEL (test patches 9002 + 9003)" \
    --summary $G/issue50-session17/call1-summary.txt --line 01-fail.json
add --id s17-c1-02-fixed --date 2026-12-07 --section 17 --session 17 --wheel $CCS --expect pass --package causal-conv1d \
    --version 1.7.0+cu13 "${H100[@]}" --command "$P pass:WHEEL (with 0005)" \
    --summary $G/issue50-session17/call1-summary.txt --line 02-pass.json
add --id s17-c1-03-memcheck-fault --date 2026-12-07 --section 17 --session 17 --expect memcheck-fail \
    --wheel causal_conv1d-1.6.2.post1+cu13-1-cp310-abi3-linux_x86_64.whl --package causal-conv1d \
    --version 1.6.2.post1+cu13 "${H100[@]}" --gpu "NVIDIA H100 80GB HBM3" --command "$P memcheck-fail:WHEEL (test patch 9004)" \
    --note "compute-sanitizer memcheck: 68 errors, an invalid read in causal_conv1d_channellast_fwd_kernel" \
    --prose --status failed --raw $G/issue50-session17/call1-03-memcheck-1.6.2-9004-sanitizer-head.log
add --id s17-c1-04-memcheck-fixed --date 2026-12-07 --section 17 --session 17 --expect memcheck-pass \
    --wheel causal_conv1d-1.6.2.post1+cu13-1-cp310-abi3-linux_x86_64.whl --package causal-conv1d \
    --version 1.6.2.post1+cu13 "${H100[@]}" --command "$P memcheck-pass:WHEEL (0005 + 0006; --quick under memcheck)" \
    --summary $G/issue50-session17/call1-summary.txt --line 04-memcheck-pass.json
add --id s17-c1-05-memcheck --date 2026-12-07 --section 17 --session 17 --expect memcheck-pass --wheel $CCS \
    --package causal-conv1d --version 1.7.0+cu13 "${H100[@]}" --command "$P memcheck-pass:WHEEL (0005; --quick under memcheck)" \
    --summary $G/issue50-session17/call1-summary.txt --line 05-memcheck-pass.json
add --id s17-c2-mamba-edge --date 2026-12-07 --section 17 --session 17 --wheel $MSS --package mamba-ssm \
    --version 2.3.2.post1+cu13 "${H100[@]}" --gpu "NVIDIA H100 80GB HBM3" \
    --command "recipes/mamba-ssm/kernel_tests.py --only '^edge_' (480 s limit)" \
    --note "8 of 9 worker groups finished; 28 of the 30 failures: upstream's constant-B last_state (fixed by patch 0006)" \
    --prose --status incomplete --passed 268 --failed 30 --raw $G/issue50-session17/call2-mamba-edge-summary.txt
add --id s17-c2-fla-boundary --date 2026-12-07 --section 17 --session 17 --wheel fla_core-0.6.0-py3-none-any.whl \
    --package fla-core --version 0.6.0 "${H100[@]}" --command "recipes/fla-core/kernel_tests.py --only boundary" \
    --note "63 skipped: fla-core's own refusal of the gated chunk backward on Hopper with Triton < 3.7.1" \
    --summary $G/issue50-session17/call2-fla-boundary-summary.txt --line fla-boundary.json
add --id s17-c2-racecheck --date 2026-12-07 --section 17 --session 17 --expect racecheck-pass --wheel $CCS \
    --package causal-conv1d --version 1.7.0+cu13 "${H100[@]}" --gpu "NVIDIA H100 80GB HBM3" \
    --command "$P racecheck-pass:WHEEL (--quick under racecheck)" \
    --note "0 hazards and 99/99 passed, but the builder of that day read only memcheck's summary and exited 10 (the table says UNMET); fixed after the call" \
    --prose --status passed --passed 99 --failed 0 --skipped 0 --raw $G/issue50-session17/call2-racecheck-table.txt
add --id s17-c3-mamba-without-0006 --date 2026-12-07 --section 17 --session 17 --wheel $MSS --expect fail \
    --package mamba-ssm --version 2.3.2.post1+cu13 "${H100[@]}" --command "recipes/mamba-ssm/kernel_tests.py --only '^edge_scan_' (without 0006)" \
    --note "upstream's constant-B last_state defect, not a planted patch" \
    --summary $G/issue50-session17/call3-mamba-scan-old-vs-0006.txt --line mamba-scan-old.json
add --id s17-c3-mamba-with-0006 --date 2026-12-07 --section 17 --session 17 --expect pass \
    --wheel mamba_ssm-2.3.2.post1+cu13-1-cp310-abi3-linux_x86_64.whl --package mamba-ssm --version 2.3.2.post1+cu13 \
    "${H100[@]}" --command "recipes/mamba-ssm/kernel_tests.py --only '^edge_scan_' (with 0006)" \
    --summary $G/issue50-session17/call3-mamba-scan-old-vs-0006.txt --line mamba-scan-new.json
# sections 18-19 (2026-12-07, H100): flash-attn (no raw file was kept: prose)
FAH=(--package flash-attn --version 2.8.3.post2+cu13torch2.11 --wheel $FA "${H100[@]}" --gpu "NVIDIA H100 80GB HBM3")
add --id s18-fa-hdim128 --date 2026-12-07 --section 18 --session 18 "${FAH[@]}" \
    --command "builder build flash-attn --version 2.8.3.post2 --cuda 13.0 --arch 90 --toolchain host --python python3 --offline --subset hdim128 --require-kernel-tests" \
    --note "the suite died with SIGSEGV in its probe: 0001's head-dim refusal crashed instead of raising (fixed the same day)" \
    --prose --status crashed
add --id s19-fa-clean --date 2026-12-07 --section 19 --session 19 "${FAH[@]}" \
    --command "builder build flash-attn ... --subset hdim128 --require-kernel-tests" \
    --note "the 6 failures were the reference's (causal alibi softmax_lse convention), fixed after the call" \
    --prose --status failed --passed 89 --failed 6 --skipped 443
add --id s19-fa-fault --date 2026-12-07 --section 19 --session 19 "${FAH[@]}" --expect fail \
    --command "$P fail:WHEEL (9001: the hdim128 causal mask off by one)" \
    --prose --status failed --passed 67 --failed 28
# section 20 (2026-12-08, H100, session 20; its raw files stay in the tree)
S20=$G/issue52-session20
add --id s20-c1-fa-clean --date 2026-12-08 --section 20 --session 20 "${FAH[@]}" --expect pass --command "$P pass:WHEEL" \
    --summary $S20/call1-summary.txt --line 01-pass.json
add --id s20-c1-fa-fault --date 2026-12-08 --section 20 --session 20 "${FAH[@]}" --expect fail \
    --command "$P fail:WHEEL (9001)" --summary $S20/call1-summary.txt --line 02-fail.json
add --id s20-c1-fa2-transformers --date 2026-12-08 --section 20 --session 20 "${FAH[@]}" \
    --command "PYTHONPATH=/tmp/fasite python3 scripts/transformers-fa2-check.py" \
    --note "transformers 5.17 flash_attention_2 on a tiny head-dim-128 Llama: varlen_fwd called 2x, max |sdpa - fa2| 0.0156" \
    --prose --status passed --raw $S20/call1-transformers-fa2.txt
add --id s20-c2-fa-fault --date 2026-12-08 --section 20 --session 20 "${FAH[@]}" --expect fail \
    --command "$P fail:WHEEL (9001, the new kvcache cases)" --summary $S20/call2-fault-summary.txt --line 01-fail.json
add --id s20-c2-cc-gpu-stable --date 2026-12-08 --section 20 --session 20 --wheel $CCS --package causal-conv1d \
    --version 1.7.0+cu13 "${H100[@]}" --gpu "NVIDIA H100 80GB HBM3" --command "scripts/gpu-stable.sh WHEEL" \
    --note "the staged causal-conv1d 1.7.0 stable wheel of session 17; doctor then named it superseded by build 1" \
    --prose --status passed --passed 627 --failed 0 --skipped 0 --raw $S20/call2-gpu-stable.log
