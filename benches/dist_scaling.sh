#!/usr/bin/env bash
# Training over several processes against one process, on this machine: the main job
# (`recipes/arithmetic-cpu.toml`) and the SmolLM2 GRPO step (`recipes/smollm2-gsm8k-grpo.toml`,
# 64 new tokens, 8 GSM8K prompts x 8 samples, one CPU shard), each run
#   1. as one process on one core (RAYON_NUM_THREADS=1, taskset -c 0): T1,
#   2. as one process on every core (the default): Tp,
#   3. as `mpirun -np 2` ranks of one core each (RAYON_NUM_THREADS=1, --bind-to core): Tr,
# and prints seconds per step (the mean of perf/step_s over the steps after the first) and the
# scaling efficiencies T1 / (2 Tp) and T1 / (2 Tr).
#
#   GSM8K_JSONL=path/to/train.jsonl benches/dist_scaling.sh [main_steps=20] [smollm2_steps=3]
#
# Needs Open MPI (Debian: openmpi-bin libopenmpi-dev libclang-dev); without GSM8K_JSONL or the
# SmolLM2 GGUF (scripts/fetch_assets.sh) only the main job runs.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN_STEPS=${1:-20}
LM_STEPS=${2:-3}
CACHE=${EMBER_CACHE:-$HOME/.cache/ember}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
cargo build --release --features mpi --quiet
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
EMBER="$OUT/ember-mpi"
cp "$TARGET/release/ember" "$EMBER"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun -np 2 --bind-to core --map-by core -x RAYON_NUM_THREADS=1)

mean_step() { # metrics.jsonl
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r][1:]
print(f"{sum(steps) / len(steps):.3f}")
PY
}

run3() { # name recipe --set options...
  local name=$1 recipe=$2
  shift 2
  RAYON_NUM_THREADS=1 taskset -c 0 "$EMBER" train "$recipe" --quiet --out "$OUT/$name-1core" "$@"
  "$EMBER" train "$recipe" --quiet --out "$OUT/$name-1proc" "$@"
  "${MPI[@]}" "$EMBER" train "$recipe" --quiet --out "$OUT/$name-2ranks" "$@"
  local t1 tp tr
  t1=$(mean_step "$OUT/$name-1core/metrics.jsonl")
  tp=$(mean_step "$OUT/$name-1proc/metrics.jsonl")
  tr=$(mean_step "$OUT/$name-2ranks/metrics.jsonl")
  python3 -c "
t1, tp, tr = $t1, $tp, $tr
print(f'$name: one core {t1:.3f} s/step | one process, all cores {tp:.3f} s/step '
      f'(efficiency {t1 / (2 * tp):.2f}) | 2 ranks x 1 core {tr:.3f} s/step '
      f'(efficiency {t1 / (2 * tr):.2f}; {tp / tr:.2f}x the one process)')"
}

run3 main recipes/arithmetic-cpu.toml --set train.steps="$MAIN_STEPS" \
  --set train.eval_every=1000 --set task.eval_size=50

GGUF="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -n "${GSM8K_JSONL:-}" ] && [ -f "$GGUF" ]; then
  run3 smollm2-grpo recipes/smollm2-gsm8k-grpo.toml --set train.steps="$LM_STEPS" \
    --set rollout.prompts_per_step=8 --set rollout.max_new_tokens=64 \
    --set train.mini_batches=1 --set task.eval_size=1 --set train.eval_every=1000 \
    --set train.checkpoint_every=1000 --set data_parallel.cpu_shards=1
fi
