#!/usr/bin/env bash
# Fetches the llama.cpp reference source for scripts/build-llama-cpp.sh: the tree vendored in
# PyPI's llama-cpp-python 0.3.36 sdist (llama.cpp 0c1e570, GUIDE §4), trimmed under the device
# tool's 64 MiB (docs, models, the web UI and the non-CPU/CUDA ggml backends dropped), as
# .llama/llama-src.tar.xz (~5 MB; ignored by git, never committed). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.llama/llama-src.tar.xz
[ -s "$OUT" ] && { echo "$OUT already there"; exit 0; }
URL=$(curl -fsS -H "Accept: application/vnd.pypi.simple.v1+json" https://pypi.org/simple/llama-cpp-python/ \
  | python3 -c "import json,sys; print(next(f['url'] for f in json.load(sys.stdin)['files'] if f['filename']=='llama_cpp_python-0.3.36.tar.gz'))")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
curl -fsSL -o "$TMP/sdist.tar.gz" "$URL"
tar -xzf "$TMP/sdist.tar.gz" -C "$TMP"
mkdir -p .llama
excludes=(--exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/tools/ui --exclude=llama.cpp/media)
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  excludes+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar -cJf "$OUT" -C "$TMP/llama_cpp_python-0.3.36/vendor" "${excludes[@]}" llama.cpp
ls -la "$OUT"
