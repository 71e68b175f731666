#!/usr/bin/env bash
# One GRPO step on SmolLM2-135M-Instruct (f32, LoRA r16/alpha32 on the seven projections), P GSM8K
# prompts x 8 samples, N new tokens, one optimizer step, no KL and no reference model: Ember
# (`recipes/smollm2-gsm8k-grpo.toml` with the overrides below; as the recipe is, then with one
# CPU shard of 32-row micro-batches instead of two concurrent shards of 16, then without
# shared-prefix scoring, then with each layer's activations checkpointed) and TRL's
# GRPOTrainer (`benches/grpo_trl.py`: its defaults, then gradient checkpointing off), one after
# the other on this machine. Prints one line per run: seconds per step, generation and update
# seconds, peak resident memory (and Ember's completion tokens/s).
#
#   GSM8K_JSONL=path/to/train.jsonl TRL_PYTHON=path/to/venv/bin/python \
#     benches/grpo_step.sh [new_tokens=64] [prompts=8] [steps=3]
#
# TRL_PYTHON is a Python with torch, transformers, trl, peft and datasets (PyPI); without it
# only Ember runs. The step figures are each run's last step, and the mean over its steps after
# the first (the first ones warm caches and fault the heap in).
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${1:-64}
PROMPTS=${2:-8}
STEPS=${3:-3}
: "${GSM8K_JSONL:?set GSM8K_JSONL to the GSM8K train.jsonl}"
CACHE=${EMBER_CACHE:-$HOME/.cache/ember}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
cargo build --release --quiet
EMBER=target/release/ember

ember_run() { # name, extra --set options...
  local name=$1
  shift
  local dir="$OUT/$name"
  rm -rf "$dir"
  /usr/bin/time -f "%M" -o "$dir.rss" "$EMBER" train recipes/smollm2-gsm8k-grpo.toml --quiet \
    --out "$dir" \
    --set train.steps="$STEPS" --set rollout.prompts_per_step="$PROMPTS" \
    --set rollout.max_new_tokens="$NEW" --set train.mini_batches=1 \
    --set train.recompute_old_log_probs=false --set task.eval_size=1 \
    --set train.eval_every=1000 --set train.checkpoint_every=1000 "$@" >/dev/null
  python3 - "$dir/metrics.jsonl" "$dir.rss" "$name" "$PROMPTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
gen = last.get("timing_s/gen", 0.0)
upd = last.get("timing_s/update_actor", 0.0)
# The step's own wall time (generation and update; the evaluation and, with rollouts drawn
# ahead, the generator's idle time are not part of it).
step = last["perf/step_s"]
tok = last["rollout/response_length"] * int(sys.argv[4]) * 8
rss = int(open(sys.argv[2]).read().split()[-1]) / 1024
# The mean over the steps after the first (rows[0] is the evaluation before training).
warm = [r["perf/step_s"] for r in rows if "perf/step_s" in r][1:] or [step]
print(f"{sys.argv[3]:<28} step {step:7.1f} s  mean after step 1 {sum(warm) / len(warm):7.1f} s  "
      f"gen {gen:6.1f} s  update {upd:6.1f} s  "
      f"{tok / step:5.1f} tok/s  "
      f"decode_efficiency {last.get('perf/decode_efficiency', float('nan')):.2f}  "
      f"peak {rss:6.0f} MiB")
EOF
}

ember_run "ember shared-prefix"
ember_run "ember one shard" --set data_parallel.cpu_shards=1
ember_run "ember unshared" --set shared_prefix=false
ember_run "ember checkpointed" --set train.checkpoint_activations=true

if [ -n "${TRL_PYTHON:-}" ]; then
  HF="$OUT/smollm2-hf"
  [ -d "$HF" ] || "$EMBER" export --model "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$HF" >/dev/null
  for gc in default off; do
    # (A run the kernel's OOM killer ends prints its exit status instead: 137.)
    rc=0
    line=$("$TRL_PYTHON" benches/grpo_trl.py --model "$HF" --data "$GSM8K_JSONL" \
      --prompts "$PROMPTS" --max-new "$NEW" --steps "$STEPS" --gradient-checkpointing "$gc" \
      --out "$OUT/trl-$gc" 2>"$OUT/trl-$gc.err") || rc=$?
    if [ "$rc" != 0 ]; then
      echo "trl gradient_checkpointing=$gc: failed (exit $rc; $OUT/trl-$gc.err)"
    else
      echo "$line" | tail -1
    fi
  done
fi
