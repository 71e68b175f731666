#!/usr/bin/env bash
# Training with a gradient through the simulator (docs/src/control.md, "Training with a gradient
# through the simulator"): `ember train` with each `[gradient]` estimator (first, zeroth, ddcg,
# ivw_h) on the cart-pole (recipes/cart-pole-ddcg.toml: 200 steps, the return counts the steps
# until the fall) and on the pendulum swing-up (recipes/pendulum-ppo.toml under `[gradient]`:
# 100-step episodes, the same σ, learning rate and Adam as the cart-pole's), 100 iterations of
# 16 episodes. ESTIMATORS, TASKS and SEEDS (space-separated) choose the runs; runs go to
# runs/gradient-study/<task>-<estimator>-s<seed>/, a finished one is skipped. Then one line per
# task and estimator: the evaluation return before → after (mean over seeds, each seed's), and
# the means over the run of the first-order weight and both estimators' trace variances.
#   SEEDS="0 1 2" bash scripts/gradient_train_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_lib.sh
read -r -a estimators <<< "${ESTIMATORS:-first zeroth ddcg ivw_h}"
read -r -a tasks <<< "${TASKS:-cart_pole pendulum}"
read -r -a seeds <<< "${SEEDS:-0 1 2}"
for seed in "${seeds[@]}"; do
  for task in "${tasks[@]}"; do
    for est in "${estimators[@]}"; do
      case "$task" in
        cart_pole) recipe=(recipes/cart-pole-ddcg.toml) ;;
        pendulum) recipe=(recipes/pendulum-ppo.toml --set env.horizon=100 --set ppo.steps=100
          --set ppo.lr=1e-2 --set ppo.adam_eps=1e-8 --set ppo.grad_clip=0 --set eval.every=10
          --set gradient.sigma=0.5) ;;
        *) echo "unknown task $task (cart_pole, pendulum)" >&2; exit 2 ;;
      esac
      study_train "runs/gradient-study/$task-$est-s$seed" "${recipe[@]}" \
        --set seed="$seed" --set "gradient.estimator=\"$est\""
    done
  done
done
python3 - "${tasks[*]}" "${estimators[*]}" "${seeds[*]}" <<'PY'
import json, sys
tasks, estimators, seeds = (a.split() for a in sys.argv[1:])
keys = ["gradient/first_weight", "gradient/first_variance", "gradient/zeroth_variance"]
print("| task | estimator | return before → after (mean) | after, per seed | first-order weight | first-order variance | zeroth-order variance |")
print("|---|---|---|---|---:|---:|---:|")
for t in tasks:
    for e in estimators:
        before, after, means = [], [], {k: [] for k in keys}
        for s in seeds:
            try:
                summary = json.load(open(f"runs/gradient-study/{t}-{e}-s{s}/summary.json"))
                rows = [json.loads(l) for l in open(f"runs/gradient-study/{t}-{e}-s{s}/metrics.jsonl")]
            except OSError:
                continue
            before.append(summary["before"]); after.append(summary["after"])
            for k in keys:
                v = [row[k] for row in rows if k in row]
                if v:
                    means[k].append(sum(v) / len(v))
        if not after:
            continue
        mean = lambda v: sum(v) / len(v) if v else float("nan")
        print(f"| {t} | {e} | {mean(before):.1f} → {mean(after):.1f} | "
              + ", ".join(f"{a:.1f}" for a in after)
              + f" | {mean(means[keys[0]]):.3f} | {mean(means[keys[1]]):.3g} | {mean(means[keys[2]]):.3g} |")
PY
