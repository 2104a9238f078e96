#!/bin/bash
# Issue 26 on the lent H200: does a restructuring change what the builder makes? Builds causal-conv1d 1.7.0 for
# sm_120 (--toolchain host, the machine's torch, the compiler cache off, one sdist) with the builder of TREE, in a
# fixed cache folder, and writes the sha256 of every file of the wheel (the .so files and METADATA above all) to
# $OUT/<name>.json. Run once per tree (each call may start a fresh machine: the cache path is the same every time),
# then compare the two JSON files:
#   run(command="bash bench/h200_same_bytes.sh .carry/before before", carry=[".carry/before", ".carry/src"])
#   run(command="bash bench/h200_same_bytes.sh . after", carry=[".carry/src"])
set -u
cd "$(dirname "$0")/.."
TREE=$(realpath "$1") NAME=$2 SDIST=$PWD/.carry/src/causal_conv1d-1.7.0.tar.gz
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/$NAME.log") 2>&1
export PYTHONUNBUFFERED=1 COLUMNS=160 PATH=$PATH:/usr/local/cuda/bin
date -u; nproc; nvcc --version | tail -1
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
WORK=/tmp/same-bytes  # the same absolute path for every tree: nvcc's internal names hash the source's path
rm -rf "$WORK"; mkdir -p "$WORK"
T0=$(date +%s)
(cd "$TREE" && BUILDER_CACHE_DIR=$WORK/cache python3 -m builder build causal-conv1d --version 1.7.0 --cuda 13.0 \
  --arch 120 --toolchain host --python python3 --offline --source "$SDIST" --jobs 16 --compiler-cache off \
  --no-kernel-tests --wheelhouse "$WORK/wh")
echo "exit $? after $(( $(date +%s) - T0 )) s"
python3 - "$WORK/wh" "$OUT/$NAME.json" <<'EOF'
import hashlib, json, pathlib, sys, zipfile
house, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheels = sorted((house / "wheels").glob("*.whl"))
result = {"wheel": wheels[0].name if wheels else None, "files": {}}
if wheels:
    with zipfile.ZipFile(wheels[0]) as z:
        for name in sorted(z.namelist()):
            result["files"][name] = hashlib.sha256(z.read(name)).hexdigest()
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        (out.parent / f"{out.stem}-METADATA").write_bytes(z.read(meta))
    record = json.loads(next((house / "records").glob("*.json")).read_text())
    result["cache_key"], result["timings"] = record.get("cache_key"), record.get("timings")
out.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1)[:4000])
EOF
