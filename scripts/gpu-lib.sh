# shellcheck shell=bash
# Shared by the scripts/gpu-*.sh checks (sourced, not run): the repository as the builder, $OUT for what comes
# back, a log line per step, the kernel-test reports copied out. Each check takes the wheels, sdists and
# wheelhouses it works on as arguments, runs offline with the machine's own python3 and torch (GPU_PYTHON to pick
# another interpreter), and writes into $OUT (default /tmp/gpu-out): gpu.log, the kernel-tests reports, the
# wheelhouses' records (no wheels). Its exit status is the number of failed steps (0: all passed), 2 on bad usage.
# The builder runs as `python3 -m builder` from this checkout (BUILDER="..." to use an installed `builder`).

set -uo pipefail
GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160} PYTHONPATH=$GPU_ROOT${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: steps may run elsewhere
export BUILDER_CACHE_DIR=${BUILDER_CACHE_DIR:-/tmp/gpu-builder-cache}
PY=${GPU_PYTHON:-python3}
# shellcheck disable=SC2034  # B: the builder command, for the scripts that source this
read -r -a B <<< "${BUILDER:-python3 -m builder}"
failed=0

# usage [STATUS]: the calling script's header comment, from line 2 to the first line that is code or a directive
usage() {
  awk 'NR == 1 { next } /^# shellcheck/ || !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"
  exit "${1:-2}"
}

die() { echo "$(basename "$0"): $*" >&2; exit 2; }

need_file() { [ -f "$1" ] || die "no such file: $1"; }
need_dir() { [ -d "$1" ] || die "no such folder: $1"; }

# start NAME: the machine in two lines, at the top of $OUT/gpu.log
start() {
  { echo "######## $1 on $(hostname) $(date -u +%FT%TZ)"
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: no NVIDIA driver here"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' 2>&1
  } | tee -a "$OUT/gpu.log"
}

# run_step CMD...: echo it, run it, tee its output into $OUT/gpu.log; its exit status
run_step() {
  echo; echo "######## $*" | tee -a "$OUT/gpu.log"
  local began=$SECONDS
  "$@" 2>&1 | tee -a "$OUT/gpu.log"
  local rc=${PIPESTATUS[0]}
  echo "######## exit $rc in $((SECONDS - began)) s" | tee -a "$OUT/gpu.log"
  return "$rc"
}

# step CMD...: a step that must pass (a failure is counted)
step() { run_step "$@" || { failed=$((failed + 1)); return 1; }; }

# expect_fail CMD...: a step that must fail (a planted fault; a wheel no GPU here runs, under --require-kernel-tests)
expect_fail() {
  if run_step "$@"; then echo "UNEXPECTED SUCCESS" | tee -a "$OUT/gpu.log"; failed=$((failed + 1))
  else echo "failed as expected" | tee -a "$OUT/gpu.log"; fi
}

# wheelhouse_of WHEEL: the wheelhouse a wheel lies in (W/wheels/x.whl or W/staging/wheels/x.whl), else nothing
wheelhouse_of() {
  local dir; dir=$(cd "$(dirname "$1")" && pwd)
  case $dir in
    */staging/wheels) echo "${dir%/staging/wheels}" ;;
    */wheels) echo "${dir%/wheels}" ;;
  esac
}

# save_reports PREFIX: the kernel-test reports and logs of this run's tests and builds, into $OUT
save_reports() {
  local f kind
  for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.log \
           "$BUILDER_CACHE_DIR"/builds/*/kernel-tests.json; do
    [ -f "$f" ] || continue
    kind=$(basename "$(dirname "$(dirname "$f")")")
    cp "$f" "$OUT/$1-$kind-$(basename "$(dirname "$f")")-$(basename "$f")"
  done
}

# save_wheelhouse WHEELHOUSE NAME: its records, index pages and staging (no wheels) as $OUT/NAME-meta.tgz
save_wheelhouse() {
  [ -d "$1" ] && tar czf "$OUT/$2-meta.tgz" --exclude='*.whl' -C "$(dirname "$1")" "$(basename "$1")"
}

finish() {
  echo "$(basename "$0"): $failed failed step(s); results in $OUT" | tee -a "$OUT/gpu.log"
  exit "$failed"
}
