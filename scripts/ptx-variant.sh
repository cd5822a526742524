#!/usr/bin/env bash
# Builds one PTX module of kernels-gpu with policy constants overridden, for A/B timing on the
# GPU through KILN_PTX_OVERRIDE (no relink needed). Usage:
#   scripts/ptx-variant.sh hopper out.ptx MATVEC_ROWS_PER_WARP=1 [CONST=VALUE ...]  (u32 or bool)
set -euo pipefail
cd "$(dirname "$0")/.."
policy=$1 out=$2
shift 2
file=policies/src/$policy.rs
cp "$file" "/tmp/kiln-policy-backup.rs"
trap 'cp /tmp/kiln-policy-backup.rs "$file"' EXIT
for kv in "$@"; do
  konst=${kv%%=*} value=${kv#*=}
  grep -qE "const $konst: (u32|bool) = " "$file" || { echo "ptx-variant: $file has no u32/bool const $konst" >&2; exit 1; }
  sed -i -E "s/const $konst: (u32|bool) = [0-9_a-z]*;/const $konst: \1 = $value;/" "$file"
done
name=$(sed -n 's/.*const NAME: &.static str = "\(sm_[0-9]*\)".*/\1/p' "$file")
cpu=$(sed -n 's/.*const PTX_TARGET: &.static str = "\(sm_[0-9a]*\)".*/\1/p' "$file")
isa=$(sed -n 's/.*const PTX_ISA: u32 = \([0-9]*\).*/\1/p' "$file")
(cd kernels-gpu && env -u RUSTFLAGS CARGO_ENCODED_RUSTFLAGS="$(printf -- '-Ctarget-cpu=%s\x1f-Ctarget-feature=+ptx%s\x1f-Clinker=%s\x1f--cfg\x1fkiln_target="%s"' "$cpu" "$isa" "$PWD/link-ptx.sh" "$name")" \
  cargo rustc --quiet --profile ptx --lib --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core --target-dir /tmp/kiln-ptx-variant)
cp /tmp/kiln-ptx-variant/nvptx64-nvidia-cuda/ptx/kernels_gpu.ptx "$out"
echo "$out: $policy $*"
