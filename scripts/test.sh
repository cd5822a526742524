#!/usr/bin/env bash
# The test command: installs what it needs on a fresh machine, then runs every test and checks
# every PTX module with NVIDIA's assembler. GPU tests skip visibly when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== toolchain (rust-toolchain.toml)"
rustup toolchain install >/dev/null
rustc -V

echo "== ptxas (PyPI nvidia-cuda-nvcc-cu12, in .venv)"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
PTXAS=$(ls .venv/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas 2>/dev/null | head -1 || true)
if [ -z "$PTXAS" ]; then
  .venv/bin/pip install -q "nvidia-cuda-nvcc-cu12==12.9.*"
  PTXAS=$(ls .venv/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas | head -1)
fi

echo "== model (for the tests that use the real SmolLM2 file)"
bash scripts/fetch-model.sh

echo "== build (also builds every PTX module via build.rs)"
cargo build --release --workspace

echo "== ptxas: assemble each module for its own target"
for dir in target/ptx/*/; do
  arch=$(basename "$dir")
  ptx="$dir/nvptx64-nvidia-cuda/ptx/kernels_gpu.ptx"
  [ -f "$ptx" ] || { echo "missing $ptx"; exit 1; }
  echo "-- $arch"
  "$PTXAS" -arch="$arch" -v "$ptx" -o /dev/null 2>&1 | awk '
    /Compiling entry function/ { name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name) }
    /bytes stack frame/ { frame = $1; spill_st = $5; spill_ld = $9 }
    /Used [0-9]+ registers/ { printf "   %-22s regs %-4s stack %-4s spill st/ld %s/%s\n", name, $5, frame, spill_st, spill_ld }'
  # Fail on any assembler error (awk above only formats).
  "$PTXAS" -arch="$arch" "$ptx" -o /dev/null
done

echo "== tests"
cargo test --release --workspace
