#!/usr/bin/env bash
# bench/gpu_kernels.py on a GPU machine with given wheels: our kernels against the torch fallbacks transformers
# runs without them, and against this GPU's copy bandwidth. The wheels are unpacked into a folder of their own
# first on PYTHONPATH (the machine's torch and transformers underneath, nothing installed); the result is
# $OUT/kernels.json.
#
#   scripts/gpu-bench.sh WHEEL [WHEEL ...] [-- BENCH-OPTION ...]
#
# WHEEL: e.g. our causal-conv1d and fla-core wheels (bench/gpu_kernels.py says what it needs importable).
# BENCH-OPTION: passed to bench/gpu_kernels.py, e.g. `--only causal` or `--repeats 3`. BENCH_TIMEOUT (seconds,
# default 600) bounds the run.
# shellcheck source=scripts/gpu-lib.sh
source "$(dirname "$0")/gpu-lib.sh"
case ${1:-} in -h|--help) usage 0 ;; ""|--) usage ;; esac
wheels=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do need_file "$1"; wheels+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift

start "gpu-bench"
site=$(mktemp -d /tmp/gpu-bench-site.XXXXXX)
step "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[@]}" || finish
step timeout "${BENCH_TIMEOUT:-600}" env PYTHONPATH="$site:$PYTHONPATH" TRITON_CACHE_DIR="$site.triton" \
  FLA_DISABLE_BACKEND_DISPATCH=1 "$PY" "$GPU_ROOT/bench/gpu_kernels.py" --out "$OUT/kernels.json" "$@"
finish
