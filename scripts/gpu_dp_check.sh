#!/usr/bin/env bash
# Runs on a GPU machine (about 3 minutes): the data-parallel update on CUDA against one device.
# The main job (recipes/arithmetic-cpu.toml, a short warm-up and 2 RL steps) runs on cuda:0
# alone, then with `data_parallel.reduce = "all_reduce"` over every GPU present (burn's NCCL
# collective; on a one-GPU machine a group of one, which still runs the collective path), then
# with `gather` over the same GPUs; the first update's gradient norm and losses must agree.
# Expects the gzipped CUDA binary at .device/ember-cuda.gz (see scripts/gpu_bench.sh for the
# offline build). Writes log.txt and the three runs' metrics into $OUT (or ./gpu-dp-out).
set -u
out=${OUT:-gpu-dp-out}
mkdir -p "$out"
source scripts/device_env.sh
n=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
common=(train recipes/arithmetic-cpu.toml --quiet --overwrite --set device=cuda
  --set warmup.steps=60 --set train.steps=2 --set train.eval_every=1000 --set task.eval_size=20)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  echo "GPUs: $n"
  echo "== one device"
  timeout 150 /tmp/ember-cuda "${common[@]}" --out /tmp/dp-one; echo "exit $?"
  echo "== all_reduce over $n device(s)"
  timeout 150 /tmp/ember-cuda "${common[@]}" --out /tmp/dp-nccl \
    --set data_parallel.devices="$n" --set data_parallel.reduce=all_reduce; echo "exit $?"
  if [ "$n" -gt 1 ]; then
    echo "== gather over $n devices"
    timeout 150 /tmp/ember-cuda "${common[@]}" --out /tmp/dp-gather \
      --set data_parallel.devices="$n" --set data_parallel.reduce=gather; echo "exit $?"
  fi
  for r in one nccl gather; do
    [ -f "/tmp/dp-$r/metrics.jsonl" ] && cp "/tmp/dp-$r/metrics.jsonl" "$out/metrics-$r.jsonl"
  done
  python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
def step1(name):
    p = os.path.join(out, f"metrics-{name}.jsonl")
    if not os.path.exists(p):
        return None
    for line in open(p):
        d = json.loads(line)
        if d.get("step") == 1:
            return d
ref = step1("one")
for name in ["nccl", "gather"]:
    d = step1(name)
    if ref is None or d is None:
        print(f"{name}: no step-1 metrics")
        continue
    for k in ["actor/grad_norm", "actor/pg_loss", "rollout/reward_mean", "perf/step_s"]:
        a, b = ref.get(k), d.get(k)
        rel = abs(a - b) / max(abs(a), 1e-9) if a is not None and b is not None else None
        print(f"{name} {k}: one device {a}, group {b}, relative difference {rel}")
PY
} 2>&1 | tee "$out/log.txt"
