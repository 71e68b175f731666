#!/usr/bin/env bash
# Runs on a GPU machine (about 10 minutes; each run has its own time limit): the warm-up of a
# recipe in two processes (first run: kernels compiled and autotuned; second run: the
# persistent kernel cache), then
# `ember bench-llm` (recipes/llm/jobs/bench.rs) of a CUDA (NVRTC) build beside PyTorch on the same
# checkpoints and shapes, f32 (Ember's kernels and the references) and bf16 mixed precision, and
# a GRPO update's pass at 1024 new tokens both ways, with the GPU's used memory sampled by
# nvidia-smi every 100 ms during each run. Expects the gzipped binary at .device/ember-cuda.gz:
#   ../shared/tools/cuda-offline/build.sh -p ember --bin ember --no-default-features --features cuda-nvrtc
#   mkdir -p .device && gzip -c target/release/ember > .device/ember-cuda.gz
# Writes warmup-*.json, ember-*.json, torch-*.json, gpu-mem-*.txt and log.txt into $OUT (or
# ./gpu-bench-out).
set -u
out=${OUT:-gpu-bench-out}
mkdir -p "$out"
source scripts/device_env.sh
rm -rf "$EMBER_KERNEL_CACHE"

# Runs "$@" while sampling the GPU's used memory; prints the peak (MiB) into $out/gpu-mem-$tag.txt.
with_mem() {
  local tag=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "/tmp/mem-$tag.csv" &
  local smi=$!
  "$@"
  local rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  sort -n "/tmp/mem-$tag.csv" | tail -n1 > "$out/gpu-mem-$tag.txt"
  echo "exit $rc; peak GPU memory used $(cat "$out/gpu-mem-$tag.txt") MiB"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n1)
  echo "GPU memory used while idle: $idle MiB"
  warm=(warmup recipes/arithmetic-cpu.toml --set device=cuda --set rollout.shape_bucket=16)
  echo "== warm-up, first process (empty kernel cache)"
  timeout 150 /tmp/ember-cuda "${warm[@]}" --json "$out/warmup-1.json"; echo "exit $?"
  echo "== warm-up, second process (persistent kernel cache)"
  timeout 90 /tmp/ember-cuda "${warm[@]}" --json "$out/warmup-2.json"; echo "exit $?"
  ls -la "$EMBER_KERNEL_CACHE"
  for size in tiny smollm2; do
    limit=$([ "$size" = tiny ] && echo 60 || echo 90)
    echo "== ember $size (cuda, f32)"
    with_mem "ember-$size" timeout "$limit" /tmp/ember-cuda bench-llm --size "$size" --device cuda --reps 3 --out /tmp/bench --json "$out/ember-$size.json"
    echo "== torch $size (cuda, f32)"
    with_mem "torch-$size" timeout 60 python3 benches/llm_torch.py --out /tmp/bench --size "$size" --device cuda --reps 3 --json "$out/torch-$size.json"
  done
  echo "== ember smollm2 (cuda, f32, the decomposed references: --kernels burn)"
  with_mem ember-smollm2-burn timeout 60 /tmp/ember-cuda bench-llm --size smollm2 --device cuda --reps 3 --kernels burn --out /tmp/bench --json "$out/ember-smollm2-burn.json"
  # A GRPO update's pass at 1024 new tokens (LoRA r16, 2 rows): the references against Ember's
  # kernels with each layer's activations checkpointed; bench-llm also prints the device's
  # reserved memory.
  echo "== ember smollm2 update, 1024 new tokens (cuda, f32, --kernels burn)"
  with_mem ember-update-burn timeout 60 /tmp/ember-cuda bench-llm --size smollm2 --device cuda --only update --update-tokens 1024 --reps 1 --kernels burn --out /tmp/bench --json "$out/ember-update-burn.json"
  echo "== ember smollm2 update, 1024 new tokens (cuda, f32, Ember's kernels, checkpointed)"
  with_mem ember-update-ember timeout 60 /tmp/ember-cuda bench-llm --size smollm2 --device cuda --only update --update-tokens 1024 --reps 1 --checkpoint --out /tmp/bench --json "$out/ember-update-ember.json"
  echo "== ember smollm2 (cuda, f32, fused attention for prefill and training)"
  with_mem ember-smollm2-fused timeout 90 /tmp/ember-cuda bench-llm --size smollm2 --device cuda --reps 3 --fused-attention --out /tmp/bench --json "$out/ember-smollm2-fused.json"
  echo "== ember smollm2 (cuda, bf16 mixed precision)"
  with_mem ember-smollm2-bf16 timeout 90 /tmp/ember-cuda bench-llm --size smollm2 --device cuda --reps 3 --precision bf16 --out /tmp/bench --json "$out/ember-smollm2-bf16.json"
  echo "== torch smollm2 (cuda, bf16 autocast)"
  with_mem torch-smollm2-bf16 timeout 60 python3 benches/llm_torch.py --out /tmp/bench --size smollm2 --device cuda --reps 3 --autocast --json "$out/torch-smollm2-bf16.json"
} 2>&1 | tee "$out/log.txt"
