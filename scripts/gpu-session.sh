#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from binaries built on the dev machine and
# carried in .gpu/ (see scripts/gpu-pack.sh). Steps, selected by arguments:
#   tests   kernel property tests on the GPU (the gpu_* tests of each tests/kernels_* binary)
#   bench   cargo xtask bench kernels -> $OUT/bench_kernels.{json,md}
#   model   CUDA vs CPU greedy generation on SmolLM2 (model reassembled from .gpu_a/.gpu_b parts)
#   compare CPU vs CUDA logits at every position (xtask compare-backends)
#   moe     a synthetic tiny-qwen3moe (gen-model): CPU vs CUDA op by op (lockstep) and free
#           running, then greedy tokens of both and the CUDA decode speed
#   steer   control vectors (scripts/random-control-vector.py): CPU vs CUDA greedy tokens
#   serve   kiln serve on CUDA: /v1/completions text vs kiln generate, streamed and not
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
COMMIT=$(cat .gpu/COMMIT 2>/dev/null || echo unknown)
# The binaries travel xz-compressed (scripts/gpu-pack.sh): unpack them once per call.
G=/tmp/kiln-bin
rm -rf $G && mkdir -p $G/tests
for f in $(cd .gpu 2>/dev/null && find . -name '*.xz'); do xz -dc ".gpu/$f" > "$G/${f%.xz}" && chmod +x "$G/${f%.xz}"; done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/smi.txt"
echo "commit $COMMIT"

for step in "$@"; do
  case "$step" in
    tests)
      echo "== GPU kernel tests"
      for t in $G/tests/*; do
        echo "-- $(basename "$t")"
        "$t" gpu_ --test-threads=1 2>&1 | grep -E "test |SKIP|panicked|error|result" | head -40
      done 2>&1 | tee "$OUT/gpu_tests.log"
      ;;
    bench)
      echo "== bench kernels"
      KILN_COMMIT=$COMMIT $G/xtask bench kernels --json "$OUT/bench_kernels.json" 2>&1 | tee "$OUT/bench_kernels.md"
      ;;
    model)
      echo "== SmolLM2 CUDA vs CPU"
      M=/tmp/smollm2.gguf
      # The model travels in two calls (64 MiB per call): part a is cached in /tmp by `cache-a`.
      [ -f .gpu/model.part_b ] && cat /tmp/smollm2.part_a .gpu/model.part_b > $M
      sha256sum $M | tee "$OUT/model_sha.txt"
      for mode in "" --f32-activations; do
      echo "-- mode: ${mode:-default (Q8_1 activations)}" | tee -a "$OUT/agreement.txt"
      for p in "The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are"; do
        for d in cpu cuda; do
          $G/kiln generate -m $M -p "$p" -n 32 --temp 0 --device $d $mode --json > "$OUT/gen_$d.json" 2> "$OUT/gen_$d.err" || { echo "$d failed:"; cat "$OUT/gen_$d.err"; }
        done
        python3 - "$OUT/gen_cpu.json" "$OUT/gen_cuda.json" "$p" <<'PY' | tee -a "$OUT/agreement.txt"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
def ids(j):
    for k in ("tokens", "token_ids", "ids", "completion_ids"):
        if k in j: return j[k]
    return None
ia, ib = ids(a), ids(b)
print(f"prompt {sys.argv[3]!r}: cpu==cuda {ia == ib}  ({len(ia or [])} tokens)")
print("  cpu :", repr(a.get("completion"))[:200])
print("  cuda:", repr(b.get("completion"))[:200])
print("  timings cpu:", a.get("timings"), " cuda:", b.get("timings"))
PY
      done
      done
      tail -2 "$OUT/gen_cuda.err"
      ;;
    compare)
      echo "== CPU vs CUDA logits (teacher-forced), SmolLM2"
      M=/tmp/smollm2.gguf
      [ -f .gpu/model.part_b ] && cat /tmp/smollm2.part_a .gpu/model.part_b > $M
      for mode in "" --f32-activations; do
        echo "-- mode: ${mode:-default (Q8_1 activations)}"
        $G/xtask compare-backends --lockstep 1e-3 $mode -m $M -n 32 -p "The capital of France is" -p "def fibonacci(n):" \
          -p "Once upon a time, in a small village," -p "The three primary colors are" 2>&1 | grep -v "rel err by position"
      done 2>&1 | tee "$OUT/compare.txt"
      ;;
    moe)
      echo "== tiny-qwen3moe: CPU vs CUDA"
      M=/tmp/tiny-qwen3moe.gguf
      $G/xtask gen-model --preset tiny-qwen3moe --quant q4_0 --out $M 2>&1 | tail -1
      # The long prompt (>= GEMM_MIN_TOKENS) takes the grouped expert GEMM; the short ones the
      # expert-sorted mat-vecs; KILN_MOE_GEMM=0 and --f32-activations the other two paths.
      LONG="The experts are routed by a small softmax gate over every token of this prompt"
      $G/xtask compare-backends --lockstep 1e-3 -m $M -n 16 -p "Hello world" -p "The experts are" -p "$LONG" 2>&1 \
        | grep -v "rel err by position" | tee "$OUT/moe_compare.txt"
      $G/xtask compare-backends -m $M -n 16 -p "Hello world" -p "The experts are" -p "$LONG" 2>&1 \
        | grep -v "rel err by position" | tee -a "$OUT/moe_compare.txt"
      KILN_MOE_GEMM=0 $G/xtask compare-backends -m $M -n 16 -p "$LONG" 2>&1 \
        | grep -v "rel err by position" | sed 's/^/[moe gemm off] /' | tee -a "$OUT/moe_compare.txt"
      $G/xtask compare-backends --f32-activations --lockstep 1e-4 -m $M -n 16 -p "$LONG" 2>&1 \
        | grep -v "rel err by position" | sed 's/^/[f32 activations] /' | tee -a "$OUT/moe_compare.txt"
      for d in cpu cuda; do
        $G/kiln generate -m $M -p "The experts are" -n 32 --temp 0 --ignore-eos --device $d --json > "$OUT/moe_$d.json" 2> "$OUT/moe_$d.err" \
          || { echo "$d failed:"; cat "$OUT/moe_$d.err"; }
      done
      python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); print("greedy cpu==cuda", a.get("tokens")==b.get("tokens"), "cuda timings", b.get("timings"))' \
        "$OUT/moe_cpu.json" "$OUT/moe_cuda.json" | tee -a "$OUT/moe_compare.txt"
      ;;
    steer)
      echo "== control vectors: CPU vs CUDA greedy tokens (f32 activations), SmolLM2 and tiny-qwen3moe"
      M=/tmp/smollm2.gguf
      [ -f .gpu/model.part_b ] && cat /tmp/smollm2.part_a .gpu/model.part_b > $M
      T=/tmp/tiny-qwen3moe.gguf
      [ -f $T ] || $G/xtask gen-model --preset tiny-qwen3moe --quant q4_0 --out $T > /dev/null 2>&1
      for m in $M $T; do
        [ -f $m ] || continue
        info=$($G/kiln info $m)
        embd=$(echo "$info" | sed -n 's/^embedding: *\([0-9]*\).*/\1/p')
        layers=$(echo "$info" | sed -n 's/^layers: *\([0-9]*\).*/\1/p')
        python3 scripts/random-control-vector.py "$embd" "$(seq -s, 1 $((layers - 1)))" 0.5 /tmp/cv.gguf
        for d in cpu cuda; do
          $G/kiln generate -m $m -p "The capital of France is" -n 32 --temp 0 --ignore-eos --device $d --f32-activations \
            --control-vector /tmp/cv.gguf --json > "$OUT/steer_$d.json" 2> "$OUT/steer_$d.err" || cat "$OUT/steer_$d.err"
        done
        python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); print(sys.argv[3], "steered greedy cpu==cuda", a.get("tokens")==b.get("tokens"), repr(b.get("completion"))[:80])' \
          "$OUT/steer_cpu.json" "$OUT/steer_cuda.json" "$(basename $m)" | tee -a "$OUT/steer.txt"
      done
      ;;
    serve)
      echo "== kiln serve on CUDA: greedy text equal to kiln generate, streamed and not (SmolLM2, else tiny-qwen3moe)"
      M=/tmp/smollm2.gguf
      [ -f .gpu/model.part_b ] && cat /tmp/smollm2.part_a .gpu/model.part_b > $M
      if [ ! -f $M ]; then
        M=/tmp/tiny-qwen3moe.gguf
        [ -f $M ] || $G/xtask gen-model --preset tiny-qwen3moe --quant q4_0 --out $M > /dev/null 2>&1
      fi
      echo "model $(basename $M)" | tee "$OUT/serve.txt"
      $G/kiln serve -m $M --device cuda --port 0 2> "$OUT/serve.err" &
      pid=$!
      for _ in $(seq 100); do grep -q "listening on" "$OUT/serve.err" && break; sleep 0.1; done
      addr=$(sed -n 's/.*listening on //p' "$OUT/serve.err")
      $G/kiln generate -m $M -p "The capital of France is" -n 32 --temp 0 --device cuda --json > "$OUT/serve_cli.json" 2> /dev/null
      python3 - "$addr" "$OUT/serve_cli.json" <<'PY' | tee -a "$OUT/serve.txt"
import json, sys, urllib.request
addr, cli = sys.argv[1], json.load(open(sys.argv[2]))
def post(body):
    req = urllib.request.Request(addr + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req).read().decode()
body = {"prompt": "The capital of France is", "max_tokens": 32, "temperature": 0}
plain = json.loads(post(body))
streamed = "".join(json.loads(l[6:])["choices"][0]["text"] for l in post({**body, "stream": True}).splitlines()
                   if l.startswith("data: {") and "text" in l)
print("serve == generate:", plain["choices"][0]["text"] == cli["completion"], " streamed == generate:", streamed == cli["completion"])
print("timings:", plain.get("timings"))
PY
      kill $pid
      ;;
    cache-a)
      cp .gpu_a/model.part_a /tmp/smollm2.part_a && echo "part a cached"
      ;;
  esac
done
