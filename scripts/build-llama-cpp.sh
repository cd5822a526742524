#!/usr/bin/env bash
# Builds llama.cpp's llama-bench for the side-by-side benchmark (GUIDE §4). Input:
# .llama/llama-src.tar.xz (or $LLAMA_SRC) — the llama.cpp tree vendored in PyPI's
# llama-cpp-python 0.3.36 sdist, trimmed under 64 MiB (docs, models, other backends dropped;
# never committed).
#   scripts/build-llama-cpp.sh            CUDA build on the GPU machine (the `device` tool): a
#                                         static, stripped llama-bench, xz-compressed and split
#                                         into parts small enough to come back from $OUT (16 MiB
#                                         per file).
#   scripts/build-llama-cpp.sh cpu [DIR]  CPU-only build on this machine into DIR/bin
#                                         (default /work/llama-cpu; outside the repo). Jobs:
#                                         $JOBS (default 1; the box is shared).
set -euo pipefail
MODE=${1:-cuda}
SRC=${LLAMA_BUILD_TMP:-/tmp/llama-src}
mkdir -p "$SRC"
[ -d "$SRC/llama.cpp" ] || tar -xJf ${LLAMA_SRC:-.llama/llama-src.tar.xz} -C "$SRC"
cd "$SRC/llama.cpp"
COMMON=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON)
if [ "$MODE" = cpu ]; then
  DEST=${2:-/work/llama-cpu}
  mkdir -p "$DEST/bin"
  cmake -B build-cpu "${COMMON[@]}" -DGGML_CUDA=OFF > "$DEST/cmake.log" 2>&1 || { tail -40 "$DEST/cmake.log"; exit 1; }
  time ninja -j "${JOBS:-1}" -C build-cpu llama-bench > "$DEST/ninja.log" 2>&1 || { tail -40 "$DEST/ninja.log"; exit 1; }
  strip build-cpu/bin/llama-bench
  cp build-cpu/bin/llama-bench "$DEST/bin/"
  ls -la "$DEST/bin/llama-bench"
  exit 0
fi
OUT=${OUT:-/tmp/llama-out}
mkdir -p "$OUT"
cmake -B build "${COMMON[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
time ninja -C build llama-bench > "$OUT/ninja.log" 2>&1 || { tail -40 "$OUT/ninja.log"; exit 1; }
strip build/bin/llama-bench
ls -la build/bin/llama-bench
git -C . rev-parse HEAD 2>/dev/null || true
./build/bin/llama-bench --help 2>&1 | head -60 > "$OUT/llama-bench-help.txt" || true
xz -T0 -6 -c build/bin/llama-bench > /tmp/llama-bench.xz
split -b 15M -d /tmp/llama-bench.xz "$OUT/llama-bench.xz.part"
ls -la "$OUT"
