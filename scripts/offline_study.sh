#!/usr/bin/env bash
# Off-policy objectives on data as it is usually collected (docs/src/offline.md, "One response
# per prompt"): per seed, the warmed-up tiny policy of recipes/arithmetic-offline.toml samples
# one response to each of 4 096 training prompts (as many samples as the 512 × 8 file), scored
# by exact match; then each objective trains on that file for the recipe's 200 steps:
#   a_lol (value = "head": V(x) fitted on the reference's prompt states), topr (c = the step's
#   mean reward), rec (one-side mask, and its -IS variant), opmd, asym_re, and REINFORCE with the
#   step's mean as its baseline (asym_re with δ = 0: no ratio, no taper, no mask).
# OBJECTIVES (names below) and SEEDS (space-separated) choose the runs; runs go to
# runs/offline-study/<objective>-s<seed>/, a finished one is skipped. Then one line per
# objective: held-out accuracy before → after and the best evaluation, per seed.
#   SEEDS="0 1" bash scripts/offline_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_lib.sh
read -r -a objectives <<< "${OBJECTIVES:-a_lol_head topr rec rec_is opmd asym_re reinforce}"
read -r -a seeds <<< "${SEEDS:-0 1}"
objective() {
  case "$1" in
    a_lol_head) echo '{kind="a_lol", value="head"}' ;;
    topr) echo '{kind="topr"}' ;;
    rec) echo '{kind="rec", pool="batch"}' ;;
    rec_is) echo '{kind="rec", pool="batch", importance_sampling=true}' ;;
    opmd) echo '{kind="opmd", pool="batch"}' ;;
    asym_re) echo '{kind="asym_re", pool="batch"}' ;;
    reinforce) echo '{kind="asym_re", pool="batch", shift=0.0}' ;;
    *) echo "unknown objective $1" >&2; exit 2 ;;
  esac
}
mkdir -p runs/offline-study
for seed in "${seeds[@]}"; do
  data="runs/offline-study/one-response-s$seed.jsonl"
  # One sample per prompt needs a preset whose baseline takes no group (TOPR's, the step's
  # mean); the samples do not depend on it.
  [ -f "$data" ] || "$EMBER" rollouts recipes/arithmetic-offline.toml --prompts 4096 \
    --set seed="$seed" --set algorithm=topr --set rollout.samples_per_prompt=1 \
    --out "$data" > /dev/null
  for o in "${objectives[@]}"; do
    study_train "runs/offline-study/$o-s$seed" recipes/arithmetic-offline.toml \
      --set seed="$seed" --set offline.data="\"$data\"" --set "offline.objective=$(objective "$o")"
  done
done
python3 - "${objectives[*]}" "${seeds[*]}" <<'PY'
import json, sys
objectives, seeds = (a.split() for a in sys.argv[1:])
print("| objective | " + " | ".join(f"seed {s}: before → after (best)" for s in seeds) + " | s |")
print("|---|" + "---|" * len(seeds) + "---:|")
for o in objectives:
    cells, secs = [], []
    for s in seeds:
        out = f"runs/offline-study/{o}-s{s}"
        try:
            summary = json.load(open(f"{out}/summary.json"))
            rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
        except OSError:
            cells.append("–")
            continue
        best = max(r["eval/accuracy"] for r in rows if "eval/accuracy" in r)
        cells.append(f"{summary['accuracy_before']:.3f} → {summary['accuracy_after']:.3f} ({best:.3f})")
        secs.append(summary["seconds"])
    span = f"{min(secs):.0f}–{max(secs):.0f}" if secs else "–"
    print(f"| {o} | " + " | ".join(cells) + f" | {span} |")
PY
