#!/usr/bin/env bash
# Runs on a GPU machine: `ember bench-llm` (src/bench.rs) of a CUDA (NVRTC) build beside PyTorch
# on the same checkpoints and shapes. Expects the gzipped binary at .device/ember-cuda.gz, built with
#   ../shared/tools/cuda-offline/build.sh -p ember --bin ember --no-default-features --features cuda-nvrtc
# Writes ember-*.json, torch-*.json and log.txt into $OUT (or ./gpu-bench-out).
set -u
out=${OUT:-gpu-bench-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
export CUBECL_CACHE_DIR=/tmp/cubecl-cache
gunzip -c .device/ember-cuda.gz > /tmp/ember-cuda && chmod +x /tmp/ember-cuda
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  for size in tiny smollm2; do
    echo "== ember $size (cuda)"
    timeout $([ "$size" = tiny ] && echo 120 || echo 180) /tmp/ember-cuda bench-llm --size "$size" --device cuda --reps 3 --out /tmp/bench --json "$out/ember-$size.json"
    echo "exit $?"
    echo "== torch $size (cuda)"
    timeout $([ "$size" = tiny ] && echo 60 || echo 80) python3 benches/llm_torch.py --out /tmp/bench --size "$size" --device cuda --reps 3 --json "$out/torch-$size.json"
    echo "exit $?"
  done
} 2>&1 | tee "$out/log.txt"
