# Sourced by the study scripts: the `ember` binary they run, and a training run that is skipped
# once it has finished (its summary.json written and not marked interrupted), so a study stopped
# half-way goes on from the first run it had not finished (that run starts again).
#   EMBER=path      run that binary instead of building (e.g. a copy, while the tree rebuilds)
# shellcheck shell=bash
if [ -z "${EMBER:-}" ]; then
  cargo build --release --offline --quiet 2>/dev/null || cargo build --release --quiet
  EMBER="${CARGO_TARGET_DIR:-target}/release/ember"
fi

# study_done OUT: whether the run in OUT finished (its summary written, not marked interrupted).
study_done() {
  grep -qs '"interrupted": *false' "$1/summary.json"
}

# study_train OUT ARGS...: `ember train ARGS --out OUT --overwrite --quiet`, unless OUT finished.
study_train() {
  local out="$1"
  shift
  study_done "$out" && return 0
  "$EMBER" train "$@" --out "$out" --overwrite --quiet
}
