#!/usr/bin/env bash
# Builds llama.cpp's llama-bench with CUDA on the GPU machine (the `device` tool), for the
# side-by-side benchmark (GUIDE §4). Input: .llama/llama-src.tar.xz — the llama.cpp tree vendored
# in PyPI's llama-cpp-python 0.3.36 sdist, trimmed under 64 MiB (docs, models, other backends
# dropped; never committed). Output: a static, stripped llama-bench, xz-compressed and split
# into parts small enough to come back from $OUT (16 MiB per file).
set -euo pipefail
OUT=${OUT:-/tmp/llama-out}
SRC=/tmp/llama-src
mkdir -p "$SRC" "$OUT"
tar -xJf ${LLAMA_SRC:-.llama/llama-src.tar.xz} -C "$SRC"
cd "$SRC/llama.cpp"
cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
time ninja -C build llama-bench > "$OUT/ninja.log" 2>&1 || { tail -40 "$OUT/ninja.log"; exit 1; }
strip build/bin/llama-bench
ls -la build/bin/llama-bench
git -C . rev-parse HEAD 2>/dev/null || true
./build/bin/llama-bench --help 2>&1 | head -60 > "$OUT/llama-bench-help.txt" || true
xz -T0 -6 -c build/bin/llama-bench > /tmp/llama-bench.xz
split -b 15M -d /tmp/llama-bench.xz "$OUT/llama-bench.xz.part"
ls -la "$OUT"
