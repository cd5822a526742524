#!/usr/bin/env bash
# Builds one PTX module of kernels-gpu with a policy constant overridden, for A/B timing on the
# GPU through KILN_PTX_OVERRIDE (no relink needed). Usage:
#   scripts/ptx-variant.sh hopper MATVEC_ROWS_PER_WARP 1 out.ptx
set -euo pipefail
cd "$(dirname "$0")/.."
policy=$1 konst=$2 value=$3 out=$4
file=policies/src/$policy.rs
cp "$file" "/tmp/kiln-policy-backup.rs"
trap 'cp /tmp/kiln-policy-backup.rs "$file"' EXIT
sed -i "s/const $konst: u32 = [0-9]*;/const $konst: u32 = $value;/" "$file"
name=$(sed -n 's/.*const NAME: &.static str = "\(sm_[0-9]*\)".*/\1/p' "$file")
cpu=$(sed -n 's/.*const PTX_TARGET: &.static str = "\(sm_[0-9a]*\)".*/\1/p' "$file")
isa=$(sed -n 's/.*const PTX_ISA: u32 = \([0-9]*\).*/\1/p' "$file")
(cd kernels-gpu && env -u RUSTFLAGS CARGO_ENCODED_RUSTFLAGS="$(printf -- '-Ctarget-cpu=%s\x1f-Ctarget-feature=+ptx%s\x1f-Clinker=%s\x1f--cfg\x1fkiln_target="%s"' "$cpu" "$isa" "$PWD/link-ptx.sh" "$name")" \
  cargo rustc --quiet --profile ptx --lib --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core --target-dir /tmp/kiln-ptx-variant)
cp /tmp/kiln-ptx-variant/nvptx64-nvidia-cuda/ptx/kernels_gpu.ptx "$out"
echo "$out: $policy $konst=$value"
