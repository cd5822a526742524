#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): where a decode step's time goes. Carried in:
# .gpu/{kiln,xtask}.xz (scripts/gpu-pack.sh bench). Arguments: presets `preset:quant`
# (default qwen3-8b:q4_0). Writes per-kernel GPU time of decode steps (nsys when the machine has
# it, else ncu over eager launches) and the graph-replayed step time to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /tmp/kb /tmp/m
for b in kiln xtask; do xz -dc .gpu/$b.xz > /tmp/kb/$b && chmod +x /tmp/kb/$b; done
echo "commit $(cat .gpu/COMMIT)"
for spec in ${@:-qwen3-8b:q4_0}; do
  f=/tmp/m/${spec%%:*}-${spec##*:}.gguf
  [ -f "$f" ] || /tmp/kb/xtask gen-model --preset "${spec%%:*}" --quant "${spec##*:}" --out "$f" 2>&1 | tail -1
  tag=${spec//:/-}
  if [ -n "${PREFILL:-}" ]; then
    # Where a 512-token prefill's time goes: every kernel of one eager prefill under ncu,
    # summed by kernel name.
    # PREFILL_REPEAT sentences of ~10 tokens (default 52: a 512-token chunk and a short tail).
    P=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog.'] * ${PREFILL_REPEAT:-52}))")
    KILN_CUDA_GRAPHS=0 timeout 300 ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv \
      /tmp/kb/kiln generate -m "$f" -p "$P" -n 1 --temp 0 --device cuda > /tmp/$tag-prefill.csv 2>/dev/null
    python3 - /tmp/$tag-prefill.csv <<'PY' | tee "$OUT/$tag-prefill-r${PREFILL_REPEAT:-52}.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12]
h = rows[0]; k, v, g, u = h.index("Kernel Name"), h.index("Metric Value"), h.index("Grid Size"), h.index("Metric Unit")
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
tot = collections.defaultdict(float); cnt = collections.Counter(); grids = collections.defaultdict(set)
for r in rows[1:]:
    name = r[k].split("(")[0]; us = float(r[v].replace(",", "")) * scale.get(r[u], 1e-3)
    tot[name] += us; cnt[name] += 1; grids[name].add(r[g])
all_us = sum(tot.values())
print(f"prefill kernels: {sum(cnt.values())} launches, {all_us:.0f} us GPU time")
for name, us in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{name:40s} {cnt[name]:5d} launches {us:9.0f} us {100*us/all_us:5.1f} %  grids {sorted(grids[name])[:4]}")
PY
    continue
  fi
  # Decode speed with and without programmatic dependent launch; the tokens must agree.
  for pdl in 1 0 1; do
    KILN_PDL=$pdl /tmp/kb/kiln generate -m "$f" -p "The capital of France is" -n 128 --temp 0 --device cuda --json > "$OUT/$tag-gen$pdl.json" 2>/dev/null
    python3 -c "import json; j=json.load(open('$OUT/$tag-gen$pdl.json')); t=j.get('timings'); print('$tag pdl=$pdl', round(t['decode_tps'],1), 'tok/s decode', hash(tuple(j.get('tokens') or j.get('completion_ids') or [])))"
  done
  NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$NSYS" ]; then
    "$NSYS" profile -q --cuda-graph-trace=node -t cuda -o /tmp/$tag -f true /tmp/kb/kiln generate -m "$f" -p "The capital of France is" -n 64 --temp 0 --device cuda > /dev/null 2>&1
    "$NSYS" stats -q --report cuda_gpu_trace --format csv -o /tmp/$tag /tmp/$tag.nsys-rep > /dev/null 2>&1
    ls /tmp/$tag*
    cp /tmp/${tag}_cuda_gpu_trace.csv "$OUT/$tag-trace.csv" 2>/dev/null
  else
    echo "no nsys; ncu over eager launches"
    KILN_CUDA_GRAPHS=0 timeout 400 ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 1200 \
      /tmp/kb/kiln generate -m "$f" -p "The capital of France is" -n 16 --temp 0 --device cuda > "$OUT/$tag-ncu.csv" 2>/dev/null
  fi
done
ls -la "$OUT"
