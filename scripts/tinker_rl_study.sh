#!/usr/bin/env bash
# The Tinker RL loop (scripts/tinker_rl_loop.py, the `tinker` SDK as a user calls it) against
# `ember serve --tinker` on the main job's task: the main job's warm-up gives the starting model
# (recipes/arithmetic-cpu.toml with no RL step), the server serves it, and the loop trains a LoRA
# on it with importance sampling for each seed. Prints one JSON line per seed.
#   scripts/tinker_rl_study.sh [STEPS] [SEEDS...]      (default: 200 steps, seeds 0 1)
# Needs the SDK's environment from scripts/fetch_assets.sh ($EMBER_CACHE/tinker-py).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
shift || true
seeds=("${@:-0}")
[ $# -eq 0 ] && seeds=(0 1)
cache=${EMBER_CACHE:-$HOME/.cache/ember}
python=$cache/tinker-py/bin/python
[ -x "$python" ] || { echo "no $python: run scripts/fetch_assets.sh" >&2; exit 1; }
cargo build --release --quiet
ember=${CARGO_TARGET_DIR:-target}/release/ember
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
"$ember" train recipes/arithmetic-cpu.toml --set train.steps=0 --set name=tinker-warm \
  --out "$work/warm" --quiet >/dev/null
model=$work/warm/final
"$ember" serve --model "$model" --served-model-name arith --port 0 --device cpu --tinker \
  --tinker-dir "$work/checkpoints" > "$work/serve.out" 2> "$work/serve.err" &
server=$!
for _ in $(seq 100); do grep -q listening "$work/serve.out" 2>/dev/null && break; sleep 0.2; done
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out" | head -1)
[ -n "$port" ] || { cat "$work/serve.err" >&2; exit 1; }
for seed in "${seeds[@]}"; do
  TINKER_TELEMETRY=0 "$python" -W ignore scripts/tinker_rl_loop.py --base-url "http://127.0.0.1:$port" \
    --model arith --tokenizer "$model/tokenizer.json" --steps "$steps" --seed "$seed" \
    --lr 3e-4 --out "$work/seed-$seed.json"
done
