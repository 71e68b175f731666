#!/usr/bin/env bash
# The unlearning study (docs/src/unlearning.md): recipes/unlearning-cpu.toml with every method
# (the learned model, retraining without the forget facts, gradient ascent, RULE, ReRULE, the
# leave-one-out teacher ensemble) on seeds 0 1 2 (or those given). Runs go to
# runs/unlearning-study/; a finished run (not one that was
# stopped) is skipped. Prints the table (means ± standard
# deviations over the seeds) and writes docs/src/unlearning_study.svg: forget accuracy against
# retain accuracy, one point per run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
methods=(none retrain gradient_ascent rule rerule loo_ensemble)
for seed in "${seeds[@]}"; do
  for m in "${methods[@]}"; do
    out="runs/unlearning-study/$m-s$seed"
    study_train "$out" recipes/unlearning-cpu.toml \
      --set seed="$seed" --set forget.method="\"$m\""
  done
done
python3 - "${methods[*]}" "${seeds[@]}" <<'PY'
import json, statistics, sys
methods, seeds = sys.argv[1].split(), sys.argv[2:]
keys = ["forget/accuracy", "forget/refusal", "forget/log_likelihood", "forget/exposure",
        "retain/accuracy", "retain/log_likelihood"]
print("| method | " + " | ".join(keys) + " | seconds |")
print("|---|" + "---:|" * (len(keys) + 1))
points = []
for m in methods:
    runs = [json.load(open(f"runs/unlearning-study/{m}-s{s}/summary.json")) for s in seeds]
    cells = []
    for k in keys:
        v = [r["after"][k] for r in runs]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        cells.append(f"{statistics.mean(v):.3f} ± {sd:.3f}")
    secs = statistics.mean(r["seconds"] for r in runs)
    print(f"| {m} | " + " | ".join(cells) + f" | {secs:.0f} |")
    points += [(m, r["after"]["forget/accuracy"], r["after"]["retain/accuracy"]) for r in runs]
# The trade-off as an SVG scatter (standard library only): x forget accuracy (lower is
# better), y retain accuracy (higher is better).
W, H, P = 560, 400, 60
colours = ["#444", "#2a7", "#d62", "#36c", "#93c", "#c93"]
def x(v): return P + v * (W - 2 * P)
def y(v): return H - P - (v - 0.8) / 0.2 * (H - 2 * P)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{P}" y1="{H-P}" x2="{W-P}" y2="{H-P}" stroke="black"/>',
       f'<line x1="{P}" y1="{P}" x2="{P}" y2="{H-P}" stroke="black"/>',
       f'<text x="{W/2}" y="{H-20}" text-anchor="middle">forget accuracy (lower: more forgotten)</text>',
       f'<text x="18" y="{H/2}" transform="rotate(-90 18 {H/2})" text-anchor="middle">retain accuracy</text>']
for t in [0, 0.25, 0.5, 0.75, 1.0]:
    svg.append(f'<text x="{x(t)}" y="{H-P+16}" text-anchor="middle">{t}</text>')
for t in [0.8, 0.85, 0.9, 0.95, 1.0]:
    svg.append(f'<text x="{P-8}" y="{y(t)+4}" text-anchor="end">{t}</text>')
for i, m in enumerate(methods):
    c = colours[i % len(colours)]
    for (mm, fa, ra) in points:
        if mm == m:
            svg.append(f'<circle cx="{x(fa):.1f}" cy="{y(max(ra, 0.8)):.1f}" r="5" fill="{c}" fill-opacity="0.7"/>')
    svg.append(f'<circle cx="{W-P-110}" cy="{P+10+16*i}" r="5" fill="{c}"/><text x="{W-P-100}" y="{P+14+16*i}">{m}</text>')
svg.append("</svg>")
open("docs/src/unlearning_study.svg", "w").write("\n".join(svg) + "\n")
PY
