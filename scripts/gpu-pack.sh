#!/usr/bin/env bash
# Packs what scripts/gpu-session.sh needs into .gpu/ (ignored by git): stripped release
# binaries of kiln, xtask and the kernel test suites, the commit id, and optionally one half of
# the SmolLM2 model (the device tool carries at most 64 MiB per call): `gpu-pack.sh [a|b]`.
# `gpu-pack.sh bench` packs only kiln and xtask, xz-compressed, to travel beside llama-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/tests
cargo build --release -p kiln -p xtask
if [ "${1:-}" = bench ]; then
  for b in kiln xtask; do strip -o /tmp/kiln-pack-$b target/release/$b && xz -T0 -6 -c /tmp/kiln-pack-$b > .gpu/$b.xz; done
  git rev-parse --short HEAD > .gpu/COMMIT
  du -sh .gpu
  exit 0
fi
(cargo test --release --no-run --test 'kernels_*' 2>&1 || echo 'gpu-pack: kernel test binaries did not build; packing without them' >&2) | sed -n 's/.*Executable .*(\(.*\))/\1/p' > /tmp/kiln-test-bins
while read -r b; do cp "$b" .gpu/tests/; done < /tmp/kiln-test-bins
cp target/release/kiln target/release/xtask .gpu/
strip .gpu/kiln .gpu/xtask .gpu/tests/* 2>/dev/null || true
# xz: the binaries travel beside model parts within the 64 MiB a call carries.
for f in .gpu/kiln .gpu/xtask .gpu/tests/*; do xz -T0 -6 "$f"; done
git rev-parse --short HEAD > .gpu/COMMIT
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  a) head -c 53000000 "$M" > .gpu/model.part_a ;;
  b) tail -c +53000001 "$M" > .gpu/model.part_b ;;
esac
du -sh .gpu
