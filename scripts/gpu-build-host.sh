#!/usr/bin/env bash
# Build a recipe on the GPU machine itself, offline, from a given sdist: the host's nvcc, the machine's python3
# and its torch, the kernel tests required on this GPU. The wheel lands in $WHEELHOUSE (default
# /tmp/gpu-build-wh); its records and index pages (no wheels) come back in $OUT/build-meta.tgz.
#
#   scripts/gpu-build-host.sh RECIPE SDIST [BUILDER-BUILD-OPTION ...]
#
# RECIPE: a recipe name (causal-conv1d); SDIST: its sdist file (causal_conv1d-1.7.0.tar.gz: the version is read
# from the name). Defaults, each replaced by the same option given after SDIST: --cuda the host nvcc's line,
# --arch this GPU's compute capability, --toolchain host, --python python3. Other `builder build` options pass
# through, e.g. `--variants --arch 90,120 --no-torch-range --quick` (the plain wheel and one thin wheel per arch),
# `--abi per-torch --torch 2.11.0`, `--recipes tests/fixtures/recipes`.
# shellcheck source=scripts/gpu-lib.sh
source "$(dirname "$0")/gpu-lib.sh"
case ${1:-} in -h|--help) usage 0 ;; "") usage ;; esac
[ $# -ge 2 ] || usage
recipe=$1; sdist=$2; shift 2
need_file "$sdist"
name=$(basename "$sdist"); name=${name%.tar.gz}; name=${name%.zip}
version=${name##*-}
[ "$version" != "$name" ] || die "cannot read a version from $sdist (expected NAME-VERSION.tar.gz)"
wheelhouse=${WHEELHOUSE:-/tmp/gpu-build-wh}

start "gpu-build-host $recipe $version"
cuda=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
defaults=(--toolchain host --python "$PY")
[ -n "$cuda" ] && defaults+=(--cuda "$cuda")
[ -n "$arch" ] && defaults+=(--arch "$arch")
step "${B[@]}" build "$recipe" --version "$version" "${defaults[@]}" --offline --source "$sdist" \
  --require-kernel-tests --wheelhouse "$wheelhouse" "$@"
find "$wheelhouse" -name '*.whl' -printf '%s %p\n' 2>/dev/null | tee -a "$OUT/gpu.log"
save_reports build
save_wheelhouse "$wheelhouse" build
finish
