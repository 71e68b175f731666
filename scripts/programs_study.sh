#!/usr/bin/env bash
# The Neural Symbolic Machines study (docs/src/programs.md): recipes/programs-cpu.toml trained
# with each method (REINFORCE, iterative maximum likelihood, augmented REINFORCE, MAPO, and
# NSM's schedule: 100 steps of iterative maximum likelihood, then augmented REINFORCE from
# fresh weights with the programs found) on seeds 0 1 2 (or those given). Runs go to runs/programs-study/; a finished run is skipped. Prints
# one line per run (method, seed, held-out accuracy before → at steps 50/100/200, final F1,
# seconds), then the mean and spread of each method's final accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
methods=(reinforce iterative_ml augmented mapo nsm)
for seed in "${seeds[@]}"; do
  for m in "${methods[@]}"; do
    out="runs/programs-study/$m-s$seed"
    case "$m" in
      nsm) sets=(--set train.method='"augmented"' --set train.ml_steps=100) ;;
      *) sets=(--set train.method="\"$m\"") ;;
    esac
    study_train "$out" recipes/programs-cpu.toml --set seed="$seed" "${sets[@]}"
  done
done
python3 - "${seeds[@]}" <<'PY'
import json, statistics, sys
seeds = sys.argv[1:]
finals = {}
print("| method | seed | held-out accuracy: step 0 → 50 → 100 → 200 | final F1 | seconds |")
print("|---|---:|---|---:|---:|")
for m in ["reinforce", "iterative_ml", "augmented", "mapo", "nsm"]:
    for s in seeds:
        out = f"runs/programs-study/{m}-s{s}"
        acc = {}
        for line in open(f"{out}/metrics.jsonl"):
            row = json.loads(line)
            if "eval/accuracy" in row:
                acc[int(row["step"])] = row["eval/accuracy"]
        summ = json.load(open(f"{out}/summary.json"))
        path = " → ".join(f"{acc[k]:.3f}" for k in (0, 50, 100, 200) if k in acc)
        finals.setdefault(m, []).append(summ["after"])
        print(f"| {m} | {s} | {path} | {summ['f1_after']:.3f} | {summ['seconds']:.0f} |")
print()
for m, v in finals.items():
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    print(f"{m}: final held-out accuracy {statistics.mean(v):.3f} ± {sd:.3f} over {len(v)} seeds")
PY
