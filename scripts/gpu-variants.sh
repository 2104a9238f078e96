#!/usr/bin/env bash
# Wheel variants (PEP 825) on a GPU machine, for one package whose plain wheel lies staged in a wheelhouse (built
# elsewhere with `builder build PACKAGE … --arch 90,120 --stage`, or here by scripts/gpu-build-host.sh
# --variants):
#  1. the staged plain wheel kernel-tested here and promoted; `builder variants PACKAGE` stages one thin wheel per
#     arch (no compile), each tested here (a variant for an arch this GPU lacks is recorded as skipped and stays
#     staged);
#  2. the user's side, with no override: doctor, `builder install` (uv with wheel variants picks this GPU's thin
#     wheel), which file got installed and the SASS its .so files carry, then pip and uv without the preview flag
#     (the plain wheel) and uv with it again; torch must stay as it was.
#
#   scripts/gpu-variants.sh [--use-only] PACKAGE WHEELHOUSE
#
# --use-only: step 2 alone (a wheelhouse that step 1 filled on an earlier call). cuobjdump on PATH names the SASS;
# uv on PATH is needed for step 2.
# shellcheck source=scripts/gpu-lib.sh
source "$(dirname "$0")/gpu-lib.sh"
case ${1:-} in -h|--help) usage 0 ;; "") usage ;; esac
use_only=""
[ "$1" = "--use-only" ] && { use_only=1; shift; }
[ $# -eq 2 ] || usage
package=$1; W=$2
need_dir "$W"
dist=$(echo "$package" | tr '-' '_')

# shellcheck disable=SC2317  # these run through run_step
installed() {  # which file of the package is installed, and the SASS its shared objects carry
  "$PY" - "$package" <<'PY'
import importlib.metadata as m, sys
try:
    d = m.distribution(sys.argv[1])
except m.PackageNotFoundError:
    sys.exit(f"{sys.argv[1]}: not installed")
print(d.version, "variant.json:", (d.read_text("variant.json") or "none (the plain wheel)").replace("\n", " ")[-160:])
for f in d.files or ():
    if f.name.endswith(".so"):
        print("so", d.locate_file(f))
PY
}
# shellcheck disable=SC2317
sass() {
  installed | sed -n 's/^so //p' | while read -r so; do
    if command -v cuobjdump >/dev/null; then
      echo "$so:"; cuobjdump --list-elf "$so" | sed 's/.*\.\(sm_[0-9]*\)\.cubin/\1/' | sort | uniq -c
    fi
  done
}
# shellcheck disable=SC2317
look() { installed | grep -v '^so '; sass; "$PY" -m pip list 2>/dev/null | grep -i '^torch '; }

start "gpu-variants $package"
if [ -z "$use_only" ]; then
  # the plain wheels: NAME-VERSION-PY-ABI-PLATFORM.whl (five fields); a variant has a sixth, its label
  for wheel in "$W"/staging/wheels/"$dist"-*.whl; do
    [ -f "$wheel" ] || { echo "no staged $dist wheel in $W/staging/wheels" | tee -a "$OUT/gpu.log"; finish; }
    fields=$(basename "$wheel" .whl | awk -F- '{ print NF }')
    [ "$fields" -eq 5 ] && step "${B[@]}" test "$wheel" --python "$PY" --wheelhouse "$W" --quick
  done
  step "${B[@]}" variants "$package" --wheelhouse "$W"
  for wheel in "$W"/staging/wheels/"$dist"-*.whl; do
    fields=$(basename "$wheel" .whl | awk -F- '{ print NF }')
    [ "$fields" -eq 6 ] && step "${B[@]}" test "$wheel" --python "$PY" --wheelhouse "$W" --no-bench
  done
  sha256sum "$W"/staging/wheels/*.whl "$W"/wheels/*.whl 2>/dev/null | tee -a "$OUT/gpu.log"
  save_reports variants
fi

"$PY" -m pip list 2>/dev/null | grep -i '^torch ' > "$OUT/torch-before.txt"
step "${B[@]}" doctor --python "$PY" --from "$W"
step "${B[@]}" install "$package" --python "$PY" --from "$W" --offline
run_step look
index=file://$(cd "$W" && pwd)/simple
step "$PY" -m pip install --no-deps --force-reinstall --index-url "$index" "$package"
run_step look
step uv pip install --python "$PY" --offline --no-deps --reinstall --index-url "$index" "$package"
run_step look
step uv pip install --python "$PY" --offline --preview-features wheel-variants --no-deps --reinstall \
  --index-url "$index" "$package"
run_step look
"$PY" -m pip list 2>/dev/null | grep -i '^torch ' > "$OUT/torch-after.txt"
if cmp -s "$OUT/torch-before.txt" "$OUT/torch-after.txt"; then echo "torch unchanged" | tee -a "$OUT/gpu.log"
else echo "TORCH CHANGED" | tee -a "$OUT/gpu.log"; failed=$((failed + 1)); fi
save_wheelhouse "$W" variants
finish
