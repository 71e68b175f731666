#!/usr/bin/env bash
# The kernel gym study (docs/src/kernel_gym.md): SmolLM2-135M-Instruct + LoRA on the gym's easiest
# tasks (recipes/kernel-gym-smollm2.toml), three arms on seeds 0 1 (or those given):
#   grpo          GRPO over the summed turn rewards, no profiling-based reward or rejection
#   trloo         TRLOO (turn-level leave-one-out), no profiling-based reward or rejection
#   trloo-pr-prs  TRLOO with the profiling-based reward and rejection sampling (the recipe)
# STEPS (default 6) steps each. Runs go to runs/kernel-gym-study/; a finished run is skipped.
# One run at a time (the real model takes both cores). Prints one line per run: the greedy
# held-out episodes' compile, correct, correct-at-any-turn, speed-up and hacking rates before
# and after, the turns PRS dropped during training, and the seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
STEPS=${STEPS:-6}
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1)
arms=(grpo trloo trloo-pr-prs)
plain=(--set env.reward.coverage=0 --set env.rejection.threshold=0 --set env.rejection.band=0)
for seed in "${seeds[@]}"; do
  for arm in "${arms[@]}"; do
    out="runs/kernel-gym-study/$arm-s$seed"
    study_done "$out" && continue
    case "$arm" in
      grpo) args=(--set 'advantage={kind="grpo"}' "${plain[@]}") ;;
      trloo) args=("${plain[@]}") ;;
      trloo-pr-prs) args=() ;;
    esac
    start=$(date +%s)
    "$EMBER" train recipes/kernel-gym-smollm2.toml --out "$out" --overwrite --quiet \
      --set seed="$seed" --set train.steps="$STEPS" --set train.eval_every="$STEPS" "${args[@]}"
    echo $(( $(date +%s) - start )) > "$out/seconds.txt"
  done
done
printf '%-13s %4s | %-31s | %-31s | %s\n' arm seed \
  "before: compiled correct best speedup hack" "after: compiled correct best speedup hack" \
  "dropped s"
for seed in "${seeds[@]}"; do
  for arm in "${arms[@]}"; do
    out="runs/kernel-gym-study/$arm-s$seed"
    python3 - "$out" "$arm" "$seed" <<'PY'
import json, sys
out, arm, seed = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
evals = [r for r in rows if "eval/success" in r]
dropped = sum(r.get("rollout/rejected_turns", 0) for r in rows)
def cells(r):
    g = lambda k: r.get(f"eval/env/{k}", 0.0)
    return (f"{g('compiled'):8.3f} {g('correct'):7.3f} {g('correct_best'):4.2f} "
            f"{r.get('eval/env/speedup', float('nan')):7.2f} {g('hacking'):4.2f}")
secs = open(f"{out}/seconds.txt").read().strip()
print(f"{arm:<13} {seed:>4} | {cells(evals[0])} | {cells(evals[-1])} | {dropped:7.0f} {secs}")
PY
  done
done
