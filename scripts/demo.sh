#!/usr/bin/env bash
# From a fresh checkout to text: toolchain (pinned by rust-toolchain.toml), model, release build,
# one chat-templated generation on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install   # reads rust-toolchain.toml
bash scripts/fetch-model.sh
cargo build --release --bin kiln
./target/release/kiln generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
  -p "Write a haiku about a kiln." -n 64 --temp 0 --device cpu
