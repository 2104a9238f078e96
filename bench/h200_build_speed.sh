#!/bin/bash
# Issue 19 on the lent H200 (16 cores, sm_90): a whole `builder build --toolchain host` before and after this
# session's defaults, side by side, each on its own half of the machine (taskset: cores 0-7 and 8-15, MAX_JOBS 8
# each, the compiler cache off, the same sdist), then the two wheels' GPU code compared cubin by cubin
# (bench/compile_profile.py same-code). One call of the device tool per package:
#   run(command="bash bench/h200_build_speed.sh causal-conv1d 1.7.0 causal_conv1d-1.7.0.tar.gz", carry=[".carry"])
# with .carry/before = `git archive <before commit> builder recipes patches dockerfiles` and .carry/src the sdists.
# KERNEL_TESTS=--require-kernel-tests (default) or --no-kernel-tests. Results: $OUT/<package>-speed.json, logs.
set -u
cd "$(dirname "$0")/.."
PKG=$1 VER=$2 SDIST=$PWD/.carry/src/$3
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/$PKG-speed.log") 2>&1
export PYTHONUNBUFFERED=1 COLUMNS=160
export PATH=$PATH:/usr/local/cuda/bin
date -u; nproc; free -g | head -2; nvcc --version | tail -1; nvidia-smi -L
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
side() {  # name tree cpus: run from the tree's own folder (python -m puts the working directory first on sys.path)
  local name=$1 tree=$2 cpus=$3
  (cd "$tree" && BUILDER_CACHE_DIR=/tmp/bc-$name taskset -c "$cpus" \
    /usr/bin/time -f "WALL %e s, peak RSS of the largest process %M KiB" \
    python3 -m builder build "$PKG" --version "$VER" --cuda 13.0 --arch 90 --toolchain host --python python3 \
      --offline --source "$SDIST" --jobs 8 --compiler-cache off ${KERNEL_TESTS:---require-kernel-tests} \
      --wheelhouse /tmp/wh-$name > "$OUT/$PKG-$name.log" 2>&1)
  echo "$name exit $?"
}
T0=$(date +%s)
side before "$PWD/.carry/before" 0-7 & b=$!
side after "$PWD" 8-15 & a=$!
wait $b $a  # not a bare wait: it would wait for the tee above too
grep -H "parallel:\|ptxas" "$OUT/$PKG-before.log" "$OUT/$PKG-after.log" | head -4
echo "both done after $(( $(date +%s) - T0 )) s"
for name in before after; do tail -4 "$OUT/$PKG-$name.log"; done
python3 - "$PKG" "$OUT/$PKG-speed.json" <<'EOF'
import json, pathlib, subprocess, sys
pkg, out = sys.argv[1], pathlib.Path(sys.argv[2])
result = {}
for name in ("before", "after"):
    recs = sorted(pathlib.Path(f"/tmp/wh-{name}/records").glob("*.whl.json"))
    rec = json.loads(recs[0].read_text()) if recs else {}
    wheels = sorted(pathlib.Path(f"/tmp/wh-{name}/wheels").glob("*.whl"))
    result[name] = {"timings": rec.get("timings"), "toolchain": rec.get("toolchain"), "parallel": rec.get("parallel"),
                    "tests": (rec.get("tests") or {}).get("counts"), "kernel_status": (rec.get("tests") or {}).get("kernel_status"),
                    "wheel": wheels[0].name if wheels else None, "wheel_bytes": wheels[0].stat().st_size if wheels else None}
if all(result[n]["wheel"] for n in ("before", "after")):
    cmp = subprocess.run([sys.executable, "bench/compile_profile.py", "same-code",
                          *(str(next(pathlib.Path(f"/tmp/wh-{n}/wheels").glob("*.whl"))) for n in ("before", "after")),
                          "--work", f"/tmp/same-{pkg}", "--out", f"/tmp/same-{pkg}.json"], capture_output=True, text=True)
    print(cmp.stdout[-1500:], cmp.stderr[-1500:])
    detail = json.loads(pathlib.Path(f"/tmp/same-{pkg}.json").read_text())
    result["same_code"] = {"same_code": detail["same_code"],
                           "cubins": {k: {kk: vv for kk, vv in v.items() if kk != "differing_sections"}
                                      | {"differing": len(v["differing_sections"])} for k, v in detail["cubins"].items()}}
out.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1)[:3000])
EOF
echo "all done after $(( $(date +%s) - T0 )) s"
