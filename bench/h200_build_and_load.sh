#!/bin/bash
# Issue 19 part 3, prepared, NOT yet run (no device was lent when it was written). For a package with no wheel
# at hand on the lent H200: build it for sm_90 there with the builder's defaults (all 16 cores, --toolchain host,
# --no-kernel-tests), then time module loads of its cubins
# re-wrapped under each fatbin compression mode (bench/compile_profile.py load, CUDA_MODULE_LOADING=LAZY,
# fresh processes). One call of the device tool:
#   run(command="bash bench/h200_build_and_load.sh mamba-ssm 2.3.2.post1 mamba_ssm-2.3.2.post1.tar.gz",
#       carry=[".carry/src"])
# Results: $OUT/load-<package>.json (and each row on stdout as it is measured), $OUT/build-<package>.log.
set -u
cd "$(dirname "$0")/.."
PKG=$1 VER=$2 SDIST=$PWD/.carry/src/$3
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=160 PATH=$PATH:/usr/local/cuda/bin
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
WORK=$(mktemp -d /tmp/load-XXXXXX)
T0=$(date +%s)
BUILDER_CACHE_DIR=$WORK/bc python3 -m builder build "$PKG" --version "$VER" --cuda 13.0 --arch 90 \
  --toolchain host --python python3 --offline --source "$SDIST" --compiler-cache off --no-kernel-tests \
  --wheelhouse "$WORK/wh" > "$OUT/build-$PKG.log" 2>&1 || { tail -20 "$OUT/build-$PKG.log"; exit 1; }
grep "timings:" "$OUT/build-$PKG.log"; echo "built after $(( $(date +%s) - T0 )) s"
python3 bench/compile_profile.py load --object "$(ls "$WORK"/wh/wheels/*.whl)" --arch 90 --modes LAZY \
  --processes 3 --repeats 5 --work "$WORK/fatbins" --out "$OUT/load-$PKG.json"
echo "all done after $(( $(date +%s) - T0 )) s"
