#!/usr/bin/env bash
# What the Tinker protocol costs: a GRPO-shaped step on SmolLM2-135M-Instruct (LoRA r16, P GSM8K
# prompts x 8 samples, N new tokens, importance sampling, one AdamW step) through the `tinker`
# SDK against `ember serve --tinker` (benches/tinker_step.py), then the same shape run by
# `ember train` (benches/grpo_step.sh's Ember command), one after the other on this machine.
#
#   GSM8K_JSONL=path/to/train.jsonl benches/tinker_step.sh [new_tokens=64] [prompts=8] [steps=3]
#
# Needs the SDK's environment from scripts/fetch_assets.sh ($EMBER_CACHE/tinker-py) and the
# SmolLM2 GGUF it fetches.
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${1:-64}
PROMPTS=${2:-8}
STEPS=${3:-3}
: "${GSM8K_JSONL:?set GSM8K_JSONL to the GSM8K train.jsonl}"
CACHE=${EMBER_CACHE:-$HOME/.cache/ember}
PY=$CACHE/tinker-py/bin/python
cargo build --release --quiet
EMBER=${CARGO_TARGET_DIR:-target}/release/ember
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
"$EMBER" serve --model "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" --served-model-name smol \
  --port 0 --device cpu --tinker --tinker-dir "$work/ck" > "$work/out" 2> "$work/err" &
server=$!
for _ in $(seq 300); do grep -q listening "$work/out" 2>/dev/null && break; sleep 0.2; done
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/out" | head -1)
[ -n "$port" ] || { cat "$work/err" >&2; exit 1; }
echo "tinker SDK: $(TINKER_TELEMETRY=0 "$PY" -W ignore benches/tinker_step.py \
  "http://127.0.0.1:$port" smol "$GSM8K_JSONL" "$NEW" "$PROMPTS" "$STEPS")"
kill "$server"
wait "$server" 2>/dev/null || true
"$EMBER" train recipes/smollm2-gsm8k-grpo.toml --quiet --out "$work/train" \
  --set train.steps="$STEPS" --set rollout.prompts_per_step="$PROMPTS" \
  --set rollout.max_new_tokens="$NEW" --set train.mini_batches=1 \
  --set train.recompute_old_log_probs=false --set task.eval_size=1 \
  --set train.eval_every=1000 --set train.checkpoint_every=1000 >/dev/null
python3 - "$work/train/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [{"step_s": round(r["perf/step_s"], 2), "gen_s": round(r.get("timing_s/gen", 0), 2),
          "update_s": round(r.get("timing_s/update_actor", 0), 2)} for r in rows if "perf/step_s" in r]
print("ember train:", json.dumps({"steps": steps}))
PY
