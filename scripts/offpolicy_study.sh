#!/usr/bin/env bash
# Which mechanism does what once the update is off-policy (docs/src/algorithms.md, "Off-policy:
# the study"): each preset on the main job (recipes/arithmetic-cpu.toml) in three regimes:
#   on      one epoch of one mini-batch (the ratio is 1: every clip, taper and mask is idle);
#   mb4e2   4 mini-batches × 2 epochs (the ratio leaves 1 from the second optimizer step on);
#   stale2  rollouts up to 2 updates old (rollout.max_staleness = 2);
#   mb4     (on request) 4 mini-batches × 1 epoch, the regime of the SmolLM2 LoRA recipe's study.
# PRESETS, REGIMES and SEEDS (space-separated) choose the runs; runs go to
# runs/offpolicy-study/<preset>-<regime>-s<seed>/, a finished one is skipped. RECIPE runs another
# recipe, its runs in runs/offpolicy-study-<the recipe's file stem>/. Then one line per
# preset and regime: held-out accuracy before → after (mean over seeds, each seed's lift), and
# the means over the run of the ratio's spread, the clip fraction, TOPR's tapered share, the
# approximate KL to π_old, the mismatch correction's k3 KL between π_old and the sampler and
# its largest ratio (stale rows), and the step time.
#   PRESETS="grpo topr" SEEDS="0 1 2" bash scripts/offpolicy_study.sh
#   RECIPE=recipes/smollm2-lora-grpo.toml PRESETS="grpo topr" REGIMES="on mb4" SEEDS="0 1" \
#     bash scripts/offpolicy_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_lib.sh
read -r -a presets <<< "${PRESETS:-grpo dr-grpo dapo cispo gspo topr}"
read -r -a regimes <<< "${REGIMES:-on mb4e2 stale2}"
read -r -a seeds <<< "${SEEDS:-0 1 2}"
recipe="${RECIPE:-recipes/arithmetic-cpu.toml}"
dir=runs/offpolicy-study
[ "$recipe" = recipes/arithmetic-cpu.toml ] || dir="runs/offpolicy-study-$(basename "$recipe" .toml)"
for seed in "${seeds[@]}"; do
  for preset in "${presets[@]}"; do
    for regime in "${regimes[@]}"; do
      case "$regime" in
        on) extra=() ;;
        mb4e2) extra=(--set train.mini_batches=4 --set train.epochs=2) ;;
        mb4) extra=(--set train.mini_batches=4) ;;
        stale2) extra=(--set rollout.max_staleness=2) ;;
        *) echo "unknown regime $regime (on, mb4e2, mb4, stale2)" >&2; exit 2 ;;
      esac
      study_train "$dir/$preset-$regime-s$seed" "$recipe" \
        --set seed="$seed" --set algorithm="$preset" "${extra[@]}"
    done
  done
done
python3 - "$dir" "${presets[*]}" "${regimes[*]}" "${seeds[*]}" <<'PY'
import json, statistics, sys
root = sys.argv[1]
presets, regimes, seeds = (a.split() for a in sys.argv[2:])
keys = ["actor/ratio_std", "actor/ratio_max", "actor/clipfrac", "actor/topr_tapered_frac",
        "actor/approx_kl", "mismatch/kl_k3", "mismatch/is_ratio_max", "perf/step_s"]
print("| preset | regime | held-out before → after (mean) | lift per seed | ratio std | ratio max | clipfrac | TOPR tapered | approx KL to π_old | k3 KL π_old ‖ sampler | IS ratio max | s/step |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for p in presets:
    for r in regimes:
        starts, ends, means = [], [], {k: [] for k in keys}
        for s in seeds:
            out = f"{root}/{p}-{r}-s{s}"
            try:
                rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
            except OSError:
                continue
            acc = [(row["step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]
            if not acc:
                continue
            starts.append(min(acc)[1]); ends.append(max(acc)[1])
            for k in keys:
                v = [row[k] for row in rows if k in row]
                if v:
                    means[k].append(sum(v) / len(v))
        if not starts:
            continue
        m = lambda xs: statistics.fmean(xs) if xs else float("nan")
        lifts = " ".join(f"{e - b:+.3f}" for b, e in zip(starts, ends))
        cells = " | ".join("–" if not means[k] else f"{m(means[k]):.3g}" for k in keys)
        print(f"| {p} | {r} | {m(starts):.3f} → {m(ends):.3f} | {lifts} | {cells} |")
PY
