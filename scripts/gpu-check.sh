#!/usr/bin/env bash
# The whole GPU check of the two-stage farm flow, run on a GPU machine with no network (the lent H200):
# wheels built and staged on a CPU machine are carried in under .carry/, tested with the machine's own torch,
# and promoted (or not). Results land in $OUT for docs/GPU-RESULTS.md.
#
#   scripts/gpu-check.sh test-good    causal-conv1d sm_90 wheel: kernel tests must pass, then promotion
#   scripts/gpu-check.sh test-bad     tinyext sm_120 wheel: kernel tests skipped with the reason (and failing
#                                     under --require-kernel-tests); planted-fault causal-conv1d wheel (wrong
#                                     SiLU): kernel tests must fail, no promotion
#   scripts/gpu-check.sh build-host   the builder run entirely here: host nvcc, the machine's python3 and torch
#   scripts/gpu-check.sh fla          fla-core kernel tests; transformers Qwen3-Next fast-path check with our wheels
#   scripts/gpu-check.sh fla-guard    experiment: fla-core's Hopper guard lifted, chunk backward judged by our reference
#   scripts/gpu-check.sh fla-old      fla-core 0.4.2 (no Hopper guard) kernel tests
#   scripts/gpu-check.sh user         the user's side on a real GPU: doctor, --arch/--cuda from the env, install of the
#                                     staged sm_90 wheels into the machine's python3 (torch held), a kernel call, doctor
#   scripts/gpu-check.sh bench        bench/gpu_kernels.py: kernels vs transformers' torch fallbacks, vs copy bandwidth
#   scripts/gpu-check.sh stable       issue 25: the stable-ABI causal-conv1d sm_90 wheel (.carry/wh-stable): kernel tests,
#                                     promotion, a downstream `import causal_conv1d_cuda` script, upstream's
#                                     determinism tests; `upstream` then runs upstream's whole test file
#   scripts/gpu-check.sh user-stable  the stable causal-conv1d and mamba-ssm wheels installed into python3, then doctor
#                                     (transformers' Mamba-2 mixers bound to them)
#   scripts/gpu-check.sh variants-build  issue 29: causal-conv1d 1.7.0 for sm_90 + sm_120 built here with --variants
#                                     (the plain wheel and one thin wheel per arch, each kernel-tested where this GPU
#                                     runs it) into .carry/wh-variants, which a warm machine keeps for the next call
#   scripts/gpu-check.sh variants-test  the plain wheel built and staged on the CPU machine instead, tested here; then
#                                     `builder variants` stages its variants here, each tested, promoted if it passes
#   scripts/gpu-check.sh variants-use  then, with no override: doctor's lines, `builder install` (uv picks the sm90
#                                     variant: the installed .so carries sm_90 only), the recipe's kernel tests
#                                     against it, pip and flagless uv taking the plain wheel; torch unchanged
#   scripts/gpu-check.sh doctor-tf    issue 38: transformers 5.25 + kernels 0.19 (.whl); doctor with our fla-core wheel
#                                     (.carry/wh-fla), then with our causal-conv1d sm_90 wheel too (.carry/wh-cc)
#   scripts/gpu-check.sh stable-offline  issue 39: causal-conv1d built here offline with --python python3 (abi auto
#                                     picks the stable wheel; torch range offline), kernel tests required;
#                                     STABLE_VERSION=1.6.2.post1 (.carry/src/<its sdist>) builds that release and
#                                     runs its full kernel suite too
#   scripts/gpu-check.sh mamba        mamba-ssm sm_90 wheel (.carry/wh-mamba): kernel tests must pass, then promotion;
#                                     with .carry/cc90/causal_conv1d-*.whl also the transformers Mamba-2 check
#   scripts/gpu-check.sh floor        issue 39: the stable-ABI wheels with torch floor 2.10 (built on the CPU machine
#                                     against torch 2.14.1, TORCH_TARGET_VERSION 2.10; .carry/wh-floor): kernel tests
#                                     with this machine's torch (FLOOR_PKG=causal_conv1d or mamba_ssm: one per call)
#   scripts/gpu-check.sh per-torch-abi3  issue 39: the per-torch cp310-abi3 wheels (TORCH_LIBRARY port; built on the
#                                     CPU machine with Python 3.11 against torch 2.11.0; .carry/wh-pyag): kernel tests
#                                     with this machine's Python and torch (ABI3_PKG=causal_conv1d or mamba_ssm); with
#                                     ABI3_BUILD=<recipe> also that recipe built here offline (--abi per-torch,
#                                     --python python3, host nvcc, .carry/src/<sdist>), kernel tests required
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 COLUMNS=160
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export BUILDER_CACHE_DIR=/tmp/builder-cache
if ls .carry/a3/*.whl >/dev/null 2>&1; then  # abi3audit and its wheels, in a venv of their own, on PATH
  python3 -m venv /tmp/a3v && /tmp/a3v/bin/pip install -q --no-index .carry/a3/*.whl && export PATH=$PATH:/tmp/a3v/bin
fi
B="python3 -m builder"
nvidia-smi -L; python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
status=0
step() { echo; echo "######## $*"; "$@" 2>&1 | tee -a "$OUT/gpu-check.log"; local rc=${PIPESTATUS[0]}; echo "######## exit $rc"; return $rc; }
expect_fail() { if step "$@"; then echo "UNEXPECTED SUCCESS"; status=1; else echo "failed as expected"; fi; }

case "${1:-}" in
  test-good)
    step $B test .carry/wh-good/staging/wheels/causal_conv1d-*.whl --python python3 --require-kernel-tests \
      --wheelhouse .carry/wh-good || status=1
    tar czf "$OUT/wh-good-meta.tgz" --exclude='*.whl' .carry/wh-good
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
    ;;
  test-bad)
    # a wheel with no arch this GPU can run (tinyext built for sm_120 only): skipped with the reason, never passed
    T="$B test .carry/wh-tiny/staging/wheels/tinyext-*.whl --python python3 --recipes tests/fixtures/recipes --wheelhouse .carry/wh-tiny"
    step $T --no-promote || status=1
    expect_fail $T --require-kernel-tests
    expect_fail $B test .carry/wh-bad/staging/wheels/causal_conv1d-*.whl --python python3 --require-kernel-tests \
      --wheelhouse .carry/wh-bad
    ls -R .carry/wh-bad | tee -a "$OUT/gpu-check.log"
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
    tar czf "$OUT/wh-bad-meta.tgz" --exclude='*.whl' .carry/wh-bad
    ;;
  build-host)
    step /usr/bin/time -f "WALL %e s" $B build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90 --toolchain host \
      --python python3 --offline --source .carry/src/causal_conv1d-1.7.0.tar.gz --require-kernel-tests \
      --wheelhouse /tmp/wh-host || status=1
    tar czf "$OUT/wh-host-meta.tgz" --exclude='*.whl' -C /tmp wh-host
    for f in "$BUILDER_CACHE_DIR"/builds/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/host-build-kernel-tests.json"; done
    ;;
  fla)
    # fla-core kernel tests, then the transformers fast path with our causal-conv1d (sm_90) + fla wheels
    # timeout: the device call has a hard limit; the builder stops the suite's process group on SIGTERM, and
    # the suite's report (written after each case group) and log still come back
    step timeout "${FLA_TIMEOUT:-540}" $B test .carry/wh-fla/staging/wheels/fla_core-*.whl --python python3 \
      --require-kernel-tests --wheelhouse .carry/wh-fla ${FLA_QUICK:+--quick --no-bench} || status=1
    FLA_CORE=$(ls .carry/wh-fla/wheels/fla_core-*.whl .carry/wh-fla/staging/wheels/fla_core-*.whl 2>/dev/null | head -1)
    if ls .carry/wh-fla/staging/wheels/flash_linear_attention-*.whl >/dev/null 2>&1; then
      step $B test .carry/wh-fla/staging/wheels/flash_linear_attention-*.whl --python python3 --require-kernel-tests \
        --with "$FLA_CORE" --with .carry/cc90/causal_conv1d-*.whl --wheelhouse .carry/wh-fla || status=1
    fi
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.log; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")").log"; done
    tar czf "$OUT/wh-fla-meta.tgz" --exclude='*.whl' .carry/wh-fla
    ;;
  fla-guard)
    # experiment, not a gate: fla-core 0.6.0 refuses the gated chunk backward on Hopper with Triton < 3.7.1
    # ("produces incorrect results", upstream #640). Lift that guard and let our reference judge the gradients.
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/guard-site \
      "$(ls .carry/wh-fla/wheels/fla_core-*.whl .carry/wh-fla/staging/wheels/fla_core-*.whl 2>/dev/null | head -1)"
    step timeout "${FLA_TIMEOUT:-240}" env PYTHONPATH=/tmp/guard-site FLA_TEST_BYPASS_HOPPER_GUARD=1 \
      TRITON_CACHE_DIR=/tmp/guard-triton python3 recipes/fla-core/kernel_tests.py --no-bench \
      --only "${GUARD_CASES:-^chunk/.*/T1000/}" --out "$OUT/fla-guard-lifted.json"
    ;;
  fla-old)
    # fla-core 0.4.2 has no Hopper guard at all: with Triton 3.6 its gated chunk backward runs; our reference judges it
    step timeout "${FLA_TIMEOUT:-240}" $B test .carry/wh-fla042/staging/wheels/fla_core-*.whl --python python3 \
      --require-kernel-tests --wheelhouse .carry/wh-fla042 --no-bench || status=1
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
    ;;
  bench)
    # bench/gpu_kernels.py with our causal-conv1d (sm_90) and fla-core wheels on the machine's torch + transformers
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/bench-site .carry/cc90/causal_conv1d-*.whl \
      "$(ls .carry/wh-fla/wheels/fla_core-*.whl .carry/wh-fla/staging/wheels/fla_core-*.whl 2>/dev/null | head -1)"
    step timeout "${BENCH_TIMEOUT:-200}" env PYTHONPATH=/tmp/bench-site TRITON_CACHE_DIR=/tmp/bench-triton \
      FLA_DISABLE_BACKEND_DISPATCH=1 python3 bench/gpu_kernels.py --out "$OUT/h200-kernels.json" ${BENCH_ONLY:+--only "$BENCH_ONLY"} || status=1
    ;;
  user)
    WH=.carry/wh90/staging
    step $B doctor --python python3 --from $WH || status=1
    step $B plan causal-conv1d --python python3 --version 1.7.0 --source .carry/src/causal_conv1d-1.7.0.tar.gz --offline \
      || status=1
    python3 -m pip list 2>/dev/null | grep -E '^(torch|triton|transformers) ' | tee "$OUT/pip-before.txt"
    step $B install causal-conv1d fla-core --python python3 --from $WH --offline || status=1
    python3 -m pip list 2>/dev/null | grep -E '^(torch|triton|transformers|causal.conv1d|fla.core) ' | tee "$OUT/pip-after.txt"
    step python3 -c 'import torch; from causal_conv1d import causal_conv1d_fn; x = torch.randn(2, 64, 512, device="cuda");
w = torch.randn(64, 4, device="cuda"); y = causal_conv1d_fn(x, w, activation="silu"); torch.cuda.synchronize();
print("causal_conv1d_fn on", torch.cuda.get_device_name(0), tuple(y.shape), y.dtype)' || status=1
    step $B doctor --python python3 --from $WH || status=1
    $B doctor --python python3 --from $WH --json > "$OUT/doctor-after.json" 2>/dev/null || status=1
    ;;
  stable)
    step $B test .carry/wh-stable/staging/wheels/causal_conv1d-*.whl --python python3 --require-kernel-tests \
      --wheelhouse .carry/wh-stable || status=1
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/stable-$(basename "$(dirname "$f")").json"; done
    tar czf "$OUT/wh-stable-meta.tgz" --exclude='*.whl' .carry/wh-stable
    WHEEL=$(ls .carry/wh-stable/wheels/causal_conv1d-*.whl .carry/wh-stable/staging/wheels/causal_conv1d-*.whl 2>/dev/null | head -1)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stable-site "$WHEEL" || status=1
    step env PYTHONPATH=/tmp/stable-site python3 scripts/downstream_causal_conv1d_cuda.py || status=1
    # upstream's own suite against the installed wheel, its determinism cases first; the test file alone, run
    # from a folder without the sdist's unpatched package beside it
    mkdir -p /tmp/upstream-tests && tar xzf .carry/src/causal_conv1d-1.7.0.tar.gz -C /tmp/upstream-tests \
      causal_conv1d-1.7.0/tests/test_causal_conv1d.py
    (cd /tmp/upstream-tests && step timeout 120 env PYTHONPATH=/tmp/stable-site python3 -m pytest -q \
      -p no:cacheprovider causal_conv1d-1.7.0/tests/test_causal_conv1d.py -k determin) || status=1
    ;;
  user-stable)
    # issue 31 item 9 with the stable-ABI wheels: install causal-conv1d and mamba-ssm into the machine's python3
    # (torch held), then doctor lists the Mamba-2 mixers' functions and what they are bound to
    python3 -m pip list 2>/dev/null | grep -E '^(torch|triton|transformers) ' | tee "$OUT/pip-before.txt"
    step $B install causal-conv1d --python python3 --from .carry/wh-stable/staging --offline || status=1
    step $B install mamba-ssm --python python3 --from .carry/wh-mamba/staging --offline || status=1
    python3 -m pip list 2>/dev/null | grep -E '^(torch|triton|transformers|causal.conv1d|mamba.ssm) ' | tee "$OUT/pip-after.txt"
    step $B doctor --python python3 --from .carry/wh-mamba/staging || status=1
    $B doctor --python python3 --from .carry/wh-mamba/staging --json > "$OUT/doctor-after.json" 2>/dev/null || status=1
    ;;
  doctor-tf)
    # issue 38: transformers 5.25 + kernels 0.19 (carried in .whl, first on PYTHONPATH) over the machine's python3 and
    # torch 2.11: our fla-core wheel alone (causal-conv1d named as the torch fallback), then our causal-conv1d sm_90
    # wheel too (all four GatedDeltaNet functions bound); the use_kernels=True hub kernels named in both
    python3 -c 'import transformers, kernels; print("transformers", transformers.__version__, "kernels", kernels.__version__)' \
      | tee "$OUT/doctor-tf-versions.txt"
    # the causal-conv1d wheel built on the CPU machine (stable ABI, sm_90): its kernel tests on this GPU first
    step timeout "${CC_TIMEOUT:-300}" $B test .carry/wh-cc/wheels/causal_conv1d-*.whl --python python3 \
      --require-kernel-tests --wheelhouse .carry/wh-cc --no-bench || status=1
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/cc-$(basename "$(dirname "$f")").json"; done
    step $B install fla-core --python python3 --from .carry/wh-fla --offline || status=1
    step $B doctor --python python3 --from .carry/wh-fla || status=1
    $B doctor --python python3 --from .carry/wh-fla --json > "$OUT/doctor-fla-only.json" 2>/dev/null || status=1
    step $B install causal-conv1d --python python3 --from .carry/wh-cc --offline || status=1
    step $B doctor --python python3 --from .carry/wh-cc || status=1
    $B doctor --python python3 --from .carry/wh-cc --json > "$OUT/doctor-both.json" 2>/dev/null || status=1
    python3 -m pip list 2>/dev/null | grep -E '^(torch|triton|transformers|kernels|causal.conv1d|fla.core) ' \
      | tee "$OUT/doctor-tf-pip.txt"
    ;;
  stable-offline)
    # issue 39: the builder run entirely here, offline, against the machine's python3 (abi auto): the stable-ABI
    # wheel, checked beside the torch this machine has, the others recorded as not checked, kernel tests required
    # (STABLE_VERSION=1.6.2.post1: the previous release through its own port, then its full kernel suite)
    v=${STABLE_VERSION:-1.7.0}
    step /usr/bin/time -f "WALL %e s" $B build causal-conv1d --version "$v" --cuda 13.0 --arch 90 --toolchain host \
      --python python3 --offline --source ".carry/src/causal_conv1d-$v.tar.gz" --require-kernel-tests --quick \
      --wheelhouse /tmp/wh-39 || status=1
    ls /tmp/wh-39/wheels /tmp/wh-39/channels | tee -a "$OUT/gpu-check.log"
    if [ -n "${STABLE_VERSION:-}" ]; then
      for w in /tmp/wh-39/wheels/causal_conv1d-"$v"+cu13-cp310-abi3-*.whl; do
        step $B test "$w" --python python3 --require-kernel-tests --no-bench --wheelhouse /tmp/wh-39 || status=1
      done
      for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/stable-$v-kernel-tests.json"; done
    fi
    tar czf "$OUT/wh-39-meta.tgz" --exclude='*.whl' -C /tmp wh-39
    ;;
  upstream)
    # upstream's whole suite against the stable wheel installed by `stable` (run after it)
    (cd /tmp/upstream-tests && step timeout "${UPSTREAM_TIMEOUT:-300}" env PYTHONPATH=/tmp/stable-site python3 -m pytest \
      -q -p no:cacheprovider causal_conv1d-1.7.0/tests/test_causal_conv1d.py --junitxml="$OUT/upstream-junit.xml") || status=1
    ;;
  floor)
    # issue 39: a floor-2.10 stable wheel built elsewhere against a newer torch, kernel-tested with this torch
    for w in .carry/wh-floor/wheels/"${FLOOR_PKG:?FLOOR_PKG=causal_conv1d or mamba_ssm}"-*.whl; do
      step timeout "${FLOOR_TIMEOUT:-480}" $B test "$w" --python python3 --require-kernel-tests \
        --wheelhouse .carry/wh-floor --no-bench || status=1
    done
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/floor-$FLOOR_PKG-$(basename "$(dirname "$f")").json"; done
    tar czf "$OUT/wh-floor-$FLOOR_PKG-meta.tgz" --exclude='*.whl' .carry/wh-floor
    ;;
  per-torch-abi3)
    # issue 39: one per-torch wheel for every Python: built with Python 3.11 elsewhere, tested with this python3
    for w in .carry/wh-pyag/wheels/"${ABI3_PKG:?ABI3_PKG=causal_conv1d or mamba_ssm}"-*-cp310-abi3-*.whl; do
      [ -f "$w" ] || continue  # none carried: only the build below
      step timeout "${ABI3_TIMEOUT:-420}" $B test "$w" --python python3 --require-kernel-tests \
        --wheelhouse .carry/wh-pyag --no-bench ${ABI3_QUICK:+--quick} || status=1
    done
    if [ -n "${ABI3_BUILD:-}" ]; then
      torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
      step /usr/bin/time -f "WALL %e s" $B build "$ABI3_BUILD" --cuda 13.0 --arch 90 --toolchain host --abi per-torch --version "${ABI3_VERSION:?ABI3_VERSION=<release>}" \
        --torch "$torch_version" --python python3 --offline --source .carry/src/"${ABI3_SDIST:?ABI3_SDIST=<sdist file>}" \
        --require-kernel-tests --quick --wheelhouse /tmp/wh-abi3 || status=1
      ls /tmp/wh-abi3/wheels /tmp/wh-abi3/channels | tee -a "$OUT/gpu-check.log"
      tar czf "$OUT/wh-abi3-meta.tgz" --exclude='*.whl' -C /tmp wh-abi3
    fi
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/abi3-$ABI3_PKG-$(basename "$(dirname "$f")").json"; done
    [ -d .carry/wh-pyag ] && tar czf "$OUT/wh-pyag-$ABI3_PKG-meta.tgz" --exclude='*.whl' .carry/wh-pyag
    ;;
  mamba)
    # mamba-ssm kernel tests with the machine's torch (timeout: the device call has a hard limit; the suite's
    # report, written after each case group, and its log still come back), then promotion
    step timeout "${MAMBA_TIMEOUT:-420}" $B test .carry/wh-mamba/staging/wheels/mamba_ssm-*.whl --python python3 \
      --require-kernel-tests --wheelhouse .carry/wh-mamba ${MAMBA_QUICK:+--quick --no-bench} ${MAMBA_NO_BENCH:+--no-bench} || status=1
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/mamba-$(basename "$(dirname "$f")").json"; done
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.log; do [ -f "$f" ] && cp "$f" "$OUT/mamba-$(basename "$(dirname "$f")").log"; done
    tar czf "$OUT/wh-mamba-meta.tgz" --exclude='*.whl' .carry/wh-mamba
    # the causal-conv1d wheel underneath: .carry/cc90's, else the stable-ABI one `stable` tested (issue 25); not
    # named CC, which Triton reads as its C compiler
    CCWHEEL=$(ls .carry/cc90/causal_conv1d-*.whl .carry/wh-stable/wheels/causal_conv1d-*.whl \
      .carry/wh-stable/staging/wheels/causal_conv1d-*.whl 2>/dev/null | head -1)
    if [ -n "$CCWHEEL" ]; then
      # transformers' Mamba2ForCausalLM with our mamba-ssm + causal-conv1d wheels against its torch path
      MAMBA=$(ls .carry/wh-mamba/wheels/mamba_ssm-*.whl .carry/wh-mamba/staging/wheels/mamba_ssm-*.whl 2>/dev/null | head -1)
      echo "transformers check with $MAMBA and $CCWHEEL" | tee -a "$OUT/gpu-check.log"
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mamba-site "$MAMBA" "$CCWHEEL"
      step timeout "${MAMBA_TF_TIMEOUT:-200}" env PYTHONPATH=/tmp/mamba-site TRITON_CACHE_DIR=/tmp/mamba-triton \
        python3 recipes/mamba-ssm/transformers_check.py --out "$OUT/mamba-transformers.json" || status=1
    fi
    ;;
  mamba-tf)
    # only the transformers check: Mamba2ForCausalLM with our mamba-ssm + causal-conv1d (sm_90) wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mamba-site .carry/mamba/*.whl || exit 1
    step timeout "${MAMBA_TF_TIMEOUT:-300}" env PYTHONPATH=/tmp/mamba-site TRITON_CACHE_DIR=/tmp/mamba-triton \
      python3 recipes/mamba-ssm/transformers_check.py --out "$OUT/mamba-transformers.json" || status=1
    ;;
  variants-build)
    W=.carry/wh-variants
    step /usr/bin/time -f "WALL %e s" $B build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 90,120 --toolchain host \
      --python python3 --offline --source .carry/src/causal_conv1d-1.7.0.tar.gz --no-torch-range --variants --quick \
      --wheelhouse $W || status=1
    ls -la $W/wheels | tee -a "$OUT/gpu-check.log"
    tar czf "$OUT/wh-variants-meta.tgz" --exclude='*.whl' $W
    ;;
  variants-test)
    # the plain wheel built and staged on the CPU machine (.carry/wh-variants: `builder build causal-conv1d --version
    # 1.7.0 --cuda 13.0 --arch 90,120 --torch 2.11.0 --stage --no-torch-range`): kernel-tested here and promoted;
    # `builder variants` stages its sm90 and sm120 variants (no compile), each tested here: sm90 promoted beside it,
    # sm120 (no sm_120 GPU here) staying in staging
    W=.carry/wh-variants
    step $B test $W/staging/wheels/causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl --python python3 \
      --wheelhouse $W --quick || status=1
    step $B variants causal-conv1d --wheelhouse $W || status=1
    sha256sum $W/staging/wheels/*.whl $W/wheels/*.whl | tee -a "$OUT/gpu-check.log"
    step $B test $W/staging/wheels/causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm90.whl --python python3 \
      --wheelhouse $W --require-kernel-tests || status=1
    step $B test $W/staging/wheels/causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm120.whl --python python3 \
      --wheelhouse $W --no-bench || true
    for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/variants-$(basename "$(dirname "$f")").json"; done
    ls -la $W/wheels $W/staging/wheels | tee -a "$OUT/gpu-check.log"
    ;;
  variants-use)
    W=.carry/wh-variants
    SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    which_file() {  # which causal-conv1d file is installed, and the SASS its .so carries
      python3 -c 'import importlib.metadata as m; d = m.distribution("causal-conv1d"); print(d.version, "variant.json:", (d.read_text("variant.json") or "none (the plain wheel)").replace("\n", " ")[-160:])'
      cuobjdump --list-elf "$SITE"/causal_conv1d/_C*.so | sed 's/.*\.\(sm_[0-9]*\)\.cubin/\1/' | sort | uniq -c
      python3 -m pip list 2>/dev/null | grep -E '^torch '
    }
    python3 -m pip list 2>/dev/null | grep -E '^torch ' | tee "$OUT/torch-before.txt"
    step $B doctor --python python3 --from $W || status=1
    step $B install causal-conv1d --python python3 --from $W --offline || status=1
    step which_file
    step timeout 300 python3 recipes/causal-conv1d/kernel_tests.py --no-bench --out "$OUT/variant-kernel-tests.json" || status=1
    # the same index for a tool that knows no variants: the plain wheel
    IDX=file://$PWD/$W/simple
    step python3 -m pip install --no-deps --force-reinstall --index-url $IDX causal-conv1d || status=1
    step which_file
    step uv pip install --python python3 --offline --no-deps --reinstall --index-url $IDX causal-conv1d || status=1
    step which_file
    step uv pip install --python python3 --offline --preview-features wheel-variants --no-deps --reinstall \
      --index-url $IDX causal-conv1d || status=1
    step which_file
    python3 -m pip list 2>/dev/null | grep -E '^torch ' | tee "$OUT/torch-after.txt"
    cmp "$OUT/torch-before.txt" "$OUT/torch-after.txt" && echo "torch unchanged" | tee -a "$OUT/gpu-check.log"
    ls -la $W/wheels | tee -a "$OUT/gpu-check.log"
    ;;
  *) echo "usage: $0 test-good|test-bad|build-host|fla|fla-guard|fla-old|user|bench|stable|upstream|user-stable|mamba|mamba-tf|variants-build|variants-test|variants-use"; exit 2 ;;
esac
echo "gpu-check ${1}: status $status"
exit $status
