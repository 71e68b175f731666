#!/usr/bin/env bash
# `ember serve` batching continuously, `ember serve --batching static`, and llama.cpp's
# `llama-server` (continuous batching, 8 slots) on the same SmolLM2 GGUF, each driven by
# benches/serve_compare.py on the loopback address with the same load; one JSON line each.
#
#   bash benches/serve_compare.sh [CLIENTS] [REQUESTS]          (defaults 8 and 48)
#
# Needs a release build (`cargo build --release`), the GGUF of scripts/fetch_assets.sh and,
# for the third server, LLAMA_SERVER=path/to/llama-server (built from the llama.cpp sources
# that the PyPI sdist llama-cpp-python==0.3.36 vendors: see benches/README.md); without it
# that server is skipped. Every server gets both cores (2 threads).
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-8}
requests=${2:-48}
cache=${EMBER_CACHE:-$HOME/.cache/ember}
gguf=${EMBER_SMOLLM2_GGUF:-$cache/SmolLM2-135M-Instruct.Q4_1.gguf}
py=${PYTHON:-python3}

wait_ready() {
  for _ in $(seq 1 600); do
    if curl -fs "http://127.0.0.1:$1/v1/models" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

run() {
  local label=$1 port=$2
  shift 2
  "$@" >/dev/null 2>&1 &
  local pid=$!
  wait_ready "$port"
  "$py" benches/serve_compare.py --port "$port" --clients "$clients" --requests "$requests" \
    --seconds 900 --label "$label"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

run "ember serve (continuous)" 8131 target/release/ember serve --model "$gguf" \
  --served-model-name smol --port 8131
run "ember serve --batching static" 8132 target/release/ember serve --model "$gguf" \
  --served-model-name smol --port 8132 --batching static
if [ -n "${LLAMA_SERVER:-}" ]; then
  run "llama.cpp llama-server (-np 8)" 8133 "$LLAMA_SERVER" -m "$gguf" --port 8133 \
    -t 2 -np 8 -c 8192 --alias smol
fi
