#!/usr/bin/env bash
# The sample-efficiency study of the guide (docs/src/images-study.md):
# every method on the digits recipe, two seeds, class accuracy and JPEG size of the evaluation
# samples against the number of images generated for training. Runs go to runs/flow-study/;
# scripts/plot_flow_study.py turns their metrics into docs/src/flow_study.png and the table.
# Usage: bash scripts/flow_study.sh [seed ...]   (default: 0 1); a finished run is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
seeds=("${@:-0}")
[ $# -eq 0 ] && seeds=(0 1)

# method name -> --set overrides (docs/src/images-study.md gives the reasons)
declare -A METHOD=(
  [ram]="algorithm=ram"
  [flow-grpo]="algorithm=flow-grpo rl.global_std=true rl.kl_form=closed_form rl.kl_coef=0.04"
  [loop]="algorithm=loop rl.kl_coef=0.01"
  [ddpo]="algorithm=flow-grpo rl.kl_coef=0"
)
# reward name -> --set overrides
declare -A REWARD=(
  [class]="rl.steps=200 rl.eval_every=25"
  [jpeg]="reward.class_prob=0 reward.jpeg_size=-1 rl.steps=60 rl.eval_every=10"
)

for reward in class jpeg; do
  for seed in "${seeds[@]}"; do
    for method in ram flow-grpo loop ddpo; do
      out="runs/flow-study/$reward-$method-s$seed"
      if study_done "$out"; then
        echo "skip $out (done)"
        continue
      fi
      sets=(--set "seed=$seed")
      for kv in ${METHOD[$method]} ${REWARD[$reward]}; do sets+=(--set "$kv"); done
      echo "run  $out: ${METHOD[$method]} ${REWARD[$reward]}"
      start=$(date +%s)
      "$EMBER" train recipes/digits-flow.toml "${sets[@]}" --out "$out" --overwrite --quiet \
        >"$out.log" 2>&1 || { echo "FAILED $out (see $out.log)"; continue; }
      echo "     $((  $(date +%s) - start )) s"
    done
  done
done
