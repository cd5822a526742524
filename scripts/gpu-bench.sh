#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): the model-level protocol of `xtask bench model`
# against llama.cpp's llama-bench on synthetic files generated there. Carried in (see
# scripts/gpu-pack.sh `bench`): .gpu/{kiln,xtask}.xz, .gpu/COMMIT and .llama/llama-bench.xz.part*
# (built by scripts/build-llama-cpp.sh, or here when absent). Arguments: the presets to measure, each
# `preset:quant` (default: qwen3-0.6b:q4_0 qwen3-8b:q4_0 qwen3-8b:q8_0). Env: REPS (default 3).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /tmp/kb /tmp/m
for b in kiln xtask; do xz -dc .gpu/$b.xz > /tmp/kb/$b && chmod +x /tmp/kb/$b; done
# No llama-bench carried (a fresh checkout): build it here from .llama/llama-src.tar.xz
# (scripts/fetch-llama-src.sh), ~4 min on 16 cores; its parts come back under $OUT/llama.
if ! ls .llama/llama-bench.xz.part* > /dev/null 2>&1; then
  OUT=$OUT/llama bash scripts/build-llama-cpp.sh > "$OUT/llama-build.log" 2>&1 || { tail -20 "$OUT/llama-build.log"; exit 1; }
  mkdir -p .llama && cp "$OUT"/llama/llama-bench.xz.part* .llama/
fi
cat .llama/llama-bench.xz.part* | xz -dc > /tmp/kb/llama-bench && chmod +x /tmp/kb/llama-bench
export KILN_COMMIT=$(cat .gpu/COMMIT) LLAMA_BENCH=/tmp/kb/llama-bench
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/smi.txt"
echo "commit $KILN_COMMIT"
models=()
for spec in "${@:-qwen3-0.6b:q4_0 qwen3-8b:q4_0 qwen3-8b:q8_0}"; do
  for s in $spec; do
    f=/tmp/m/${s%%:*}-${s##*:}.gguf
    [ -f "$f" ] || { /usr/bin/time -f "gen-model $s: %e s" /tmp/kb/xtask gen-model --preset "${s%%:*}" --quant "${s##*:}" --out "$f" 2>&1 | tail -2; }
    models+=(-m "$f")
  done
done
# Recorded decode steps must not change a single token: greedy text with and without graphs.
first=${models[1]}
for g in 0 1; do
  KILN_CUDA_GRAPHS=$g /tmp/kb/kiln generate -m "$first" -p "The capital of France is" -n 48 --temp 0 --device cuda --json > "$OUT/graphs_$g.json" 2> "$OUT/graphs_$g.err" || cat "$OUT/graphs_$g.err"
done
python3 - "$OUT/graphs_0.json" "$OUT/graphs_1.json" <<'PY' | tee "$OUT/graphs_agreement.txt"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ka = next(k for k in ("tokens", "token_ids", "ids") if k in a)
print("graphs off == on:", a[ka] == b[ka], len(a[ka]), "tokens")
print("timings off:", a.get("timings")); print("timings on: ", b.get("timings"))
PY
/tmp/kb/xtask bench model "${models[@]}" --reps "${REPS:-3}" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
# At most 8 files come back from $OUT: keep bench/bench.{json,md,svg} and a freshly built
# llama-bench's three parts (carry them as .llama/ next time), fold every log into one tarball.
logs=$(cd "$OUT" && ls -d graphs_* smi.txt bench.log llama-build.log llama/*.log llama/*.txt 2>/dev/null)
tar -czf "$OUT/logs.tar.gz" -C "$OUT" $logs && (cd "$OUT" && rm -f $logs)
ls -R "$OUT"
