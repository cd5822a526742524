#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): A/B of builds and PTX variants on whole models,
# decode by default, kiln only (`xtask bench model --pp 0`: tg128 and tg128 at depth 4096), alternating.
# Carried in: .gpu/variants, one variant per line `NAME XTASK_XZ [PTX|-] [VAR=VALUE ...]` (an
# xz-compressed xtask binary, e.g. from scripts/gpu-pack.sh bench; optionally a PTX module for
# KILN_PTX_OVERRIDE from scripts/ptx-variant.sh, `-` for none; then environment settings), with
# those files. Arguments: presets
# `preset:quant`. Env: ROUNDS (default 2, one rep per variant each), KERNELS=1 also runs
# `xtask bench kernels` per variant, BENCH_ARGS replaces the test selection `--pp 0` (e.g.
# `--tg 0 --depth 0` for prefill only).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /tmp/kb /tmp/m
unset LLAMA_BENCH
names=()
while read -r name bin ptx envs; do
  [ -n "$name" ] || continue
  xz -dc "$bin" > "/tmp/kb/xtask-$name" && chmod +x "/tmp/kb/xtask-$name"
  names+=("$name")
  [ "${ptx:--}" = - ] && ptx=
  echo "${ptx:-}" > "/tmp/kb/ptx-$name"
  echo "${envs:-}" > "/tmp/kb/env-$name"
done < .gpu/variants
run() { # variant, then xtask arguments
  local v=$1 p e; shift; p=$(cat /tmp/kb/ptx-$v); e=$(cat /tmp/kb/env-$v)
  if [ -n "$p" ]; then e="$e KILN_PTX_OVERRIDE=$PWD/$p"; fi
  env $e "/tmp/kb/xtask-$v" "$@"
}
echo "commit $(cat .gpu/COMMIT 2>/dev/null); variants: ${names[*]}" | tee "$OUT/variants.txt"
for spec in "$@"; do
  f=/tmp/m/${spec%%:*}-${spec##*:}.gguf
  [ -f "$f" ] || run "${names[0]}" gen-model --preset "${spec%%:*}" --quant "${spec##*:}" --out "$f" 2>&1 | tail -1
done
for round in $(seq "${ROUNDS:-2}"); do
  for spec in "$@"; do
    f=/tmp/m/${spec%%:*}-${spec##*:}.gguf
    for v in "${names[@]}"; do
      run "$v" bench model -m "$f" ${BENCH_ARGS:---pp 0} --reps 1 --out "/tmp/kb/out-$v" > "/tmp/kb/log-$v" 2>&1 || tail -5 "/tmp/kb/log-$v"
      grep -E "^\| .*(tg[0-9]+|pp[0-9]+)" "/tmp/kb/out-$v/bench.md" | sed "s/^/round $round $v /" | tee -a "$OUT/variants.txt"
    done
  done
done
if [ -n "${KERNELS:-}" ]; then
  for v in "${names[@]}"; do
    echo "== bench kernels: $v" | tee -a "$OUT/variants.txt"
    run "$v" bench kernels --iters 100 2>&1 | grep -E "^\| (matvec|mma)" | tee -a "$OUT/variants.txt"
  done
fi
