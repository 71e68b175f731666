#!/usr/bin/env bash
# The LANPO study (docs/src/lanpo.md): GRPO (recipes/smollm2-lora-grpo.toml, 4 samples per
# prompt) against LANPO (recipes/lanpo-smollm2.toml, the same 4 samples: 2 from scratch, 2 with
# feedback) and LANPO with the feedback kept in the update's context, on seeds 0 1 (or those
# given); then the final adapters' greedy accuracy on 256 held-out problems. Runs go to
# runs/lanpo-study/; a finished run is skipped. One run at a time (the real model takes both
# cores). Prints one line per run: arm, seed, accuracy at steps 0/10/20, on 256, seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/study_lib.sh
source scripts/study_lib.sh
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1)
arms=(grpo lanpo lanpo-kept)
for seed in "${seeds[@]}"; do
  for arm in "${arms[@]}"; do
    out="runs/lanpo-study/$arm-s$seed"
    # A finished arm has its evaluation too; a stopped one trains again, then evaluates.
    [ -s "$out/eval256.txt" ] && study_done "$out" && continue
    case "$arm" in
      grpo) args=(recipes/smollm2-lora-grpo.toml) ;;
      lanpo) args=(recipes/lanpo-smollm2.toml) ;;
      lanpo-kept) args=(recipes/lanpo-smollm2.toml --set lanpo.update_context=kept) ;;
    esac
    study_train "$out" "${args[@]}" --set seed="$seed"
    "$EMBER" eval "$out" --eval-size 256 > "$out/eval256.txt"
  done
done
for seed in "${seeds[@]}"; do
  for arm in "${arms[@]}"; do
    out="runs/lanpo-study/$arm-s$seed"
    python3 - "$out" "$arm" "$seed" <<'PY'
import json, sys, re
out, arm, seed = sys.argv[1:]
acc = {}
fb = []
for line in open(f"{out}/metrics.jsonl"):
    row = json.loads(line)
    if "eval/accuracy" in row:
        acc[int(row["step"])] = row["eval/accuracy"]
    if "lanpo/reward_feedback" in row:
        fb.append((row["lanpo/reward_scratch"], row["lanpo/reward_feedback"]))
s = json.load(open(f"{out}/summary.json"))
e256 = re.findall(r"[0-9]+\.[0-9]+", open(f"{out}/eval256.txt").read())
steps = " ".join(f"{acc.get(k, float('nan')):.3f}" for k in (0, 10, 20))
extra = ""
if fb:
    extra = " reward scratch/feedback %.3f/%.3f" % tuple(sum(x) / len(fb) for x in zip(*fb))
print(f"{arm:11s} seed {seed}: acc {steps} | 256: {e256[0] if e256 else '?'} | {s['seconds']:.0f} s{extra}")
PY
  done
done
