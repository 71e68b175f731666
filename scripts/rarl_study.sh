#!/usr/bin/env bash
# The RARL robustness study (docs/src/control.md): recipes/pendulum-rarl.toml with its adversary
# and without (adversary.max_force=0, the baseline), on seeds 0 1 2 (or those given). Runs go to
# runs/rarl-study/; scripts/plot_rarl_study.py turns their summaries into the table and
# docs/src/rarl_study.png. A finished run (not one that was stopped) is skipped. Two runs at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  for arm in rarl baseline; do
    out="runs/rarl-study/$arm-s$seed"
    force=0.5
    [ "$arm" = baseline ] && force=0
    study_train "$out" recipes/pendulum-rarl.toml \
      --set seed="$seed" --set adversary.max_force="$force" &
  done
  wait
done
