#!/usr/bin/env bash
# The kernel gym's timing alone and on a loaded machine: the reference's own loop submitted as
# `vec_add` (so its true speed-up is 1), and a vectorised `vec_add`, each evaluated alone and
# N at once (as a trainer scoring a batch of kernels does); prints each evaluation's speed-up,
# noise (interquartile range / median) and times.
#
#   benches/gym_load.sh [N=6] [EMBER=target/release/ember]
#
# Run it with two builds in one window to compare them (EMBER=path/to/other/ember).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-6}
EMBER=${2:-}
if [ -z "$EMBER" ]; then
  cargo build --release --bin ember --quiet
  TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  EMBER="$TARGET/release/ember"
fi
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cat > "$DIR/same.c" <<'C'
void vec_add(const float *a, const float *b, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
C
cat > "$DIR/fast.c" <<'C'
typedef float v16 __attribute__((vector_size(64), aligned(4)));
void vec_add(const float *a, const float *b, float *out, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) *(v16 *)(out + i) = *(const v16 *)(a + i) + *(const v16 *)(b + i);
    for (; i < n; i++) out[i] = a[i] + b[i];
}
C
row() { # kernel, at once
  for i in $(seq 1 "$2"); do
    "$EMBER" gym eval --task vec_add "$DIR/$1.c" > "$DIR/out.$i" &
  done
  wait
  for i in $(seq 1 "$2"); do
    python3 - "$DIR/out.$i" "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:5} x{sys.argv[3]:<2} {r['verdict']:4} speedup {r['speedup']:.3f} noise {r['noise']:.3f} "
      f"ref {r['ref_ns'] / 1e3:.1f} us kernel {r['kernel_ns'] / 1e3:.1f} us")
PY
  done
}
for k in same fast; do
  row "$k" 1
  row "$k" "$N"
done
