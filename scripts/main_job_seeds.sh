#!/usr/bin/env bash
# The README's main job (recipes/arithmetic-cpu.toml) on several seeds and kernel settings: the
# held-out accuracy after the warm-up and after RL, the lift, and the seconds of each run, as one
# table; the README quotes its spread.
#   SEEDS="0 1 2 3 4" KERNELS="ember burn" bash scripts/main_job_seeds.sh [--set KEY=VALUE ...]
#   OUT=runs/main-job-seeds   where the runs go (a finished run is not run again)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_lib.sh
out=${OUT:-runs/main-job-seeds}
mkdir -p "$out"
printf '%-7s %-5s %8s %8s %7s %7s\n' kernels seed before after lift seconds
for k in ${KERNELS:-ember burn}; do
  for s in ${SEEDS:-0 1 2 3 4}; do
    dir="$out/$k-seed$s"
    study_train "$dir" recipes/arithmetic-cpu.toml --kernels "$k" --set "seed=$s" \
      --set train.eval_every=1000 "$@" >/dev/null
    python3 - "$dir/summary.json" "$k" "$s" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b, a = r["accuracy_before"], r["accuracy_after"]
print(f"{sys.argv[2]:<7} {sys.argv[3]:<5} {b:8.3f} {a:8.3f} {a - b:+7.3f} {r['seconds']:7.0f}")
PY
  done
done
