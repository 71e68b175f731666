"""Hostile `--set` values for every number and list of a recipe, one run each, classified.

    python3 scripts/fuzz_set.py recipes/pendulum-rarl.toml --base ppo.steps=1 env.episodes=2 \
        --out /tmp/fuzz-rarl.json [--timeout 60] [--ember target/release/ember] [--command molora]

Reads the resolved recipe of one run with the `--base` values (`recipe.resolved.toml`), then,
for each numeric leaf and each list, runs `ember train` with the `--base` values and one hostile
value (0, -1, nan, inf, 1e300, 2^63-1, -2^63, a string, a boolean; for lists [], [0], [1e300]).
Each outcome is one of: `refused` (exit status 2 or 1 with an error line and no panic),
`ran` (exit 0), `panic` (a Rust panic or exit 101), `abort` (killed by a signal),
`hang` (past --timeout). Prints the counts and writes every try to --out.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib

import fuzz_common

VALUES = ["0", "-1", "nan", "inf", "1e300", "9223372036854775807", "-9223372036854775808",
          '"x"', "true"]
LISTS = ["[]", "[0]", "[1e300]"]


def leaves(table, prefix=""):
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from leaves(v, key + ".")
        elif isinstance(v, bool):
            continue
        elif isinstance(v, (int, float)):
            yield key, VALUES
        elif isinstance(v, list):
            yield key, LISTS + VALUES[:1]


def run(ember, recipe, sets, timeout, command="train"):
    out = tempfile.mkdtemp(prefix="ember-fuzz-")
    cmd = [ember, command, recipe, "--quiet", "--out", out]
    for s in sets:
        cmd += ["--set", s]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["rm", "-rf", out])
        return "hang", "", out
    err = p.stderr.strip().splitlines()
    last = err[-1] if err else ""
    if p.returncode < 0:
        kind = "abort"
    elif "panicked" in p.stderr or p.returncode == 101:
        kind = "panic"
    elif p.returncode == 0:
        kind = "ran"
    else:
        kind = "refused"
    return kind, last[:300], out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--base", nargs="*", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--ember", default="target/release/ember")
    ap.add_argument("--command", default="train", help="the ember subcommand (molora: its own)")
    a = ap.parse_args()
    kind, last, out = run(a.ember, a.recipe, a.base, a.timeout, a.command)
    if kind != "ran":
        sys.exit(f"the base run did not succeed ({kind}): {last}")
    # The resolved recipe when the command writes one (`ember train`), else the file itself.
    resolved_path = os.path.join(out, "recipe.resolved.toml")
    with open(resolved_path if os.path.exists(resolved_path) else a.recipe, "rb") as f:
        resolved = tomllib.load(f)
    subprocess.run(["rm", "-rf", out])
    tries = []
    for key, values in leaves(resolved):
        for v in values:
            kind, last, out = run(a.ember, a.recipe, a.base + [f"{key}={v}"], a.timeout,
                                  a.command)
            subprocess.run(["rm", "-rf", out])
            tries.append({"key": key, "value": v, "outcome": kind, "stderr": last})
            print(f"{kind:8} {key}={v}  {last[:120]}", flush=True)
    fuzz_common.write_counts(a.out, tries, recipe=a.recipe, base=a.base)


if __name__ == "__main__":
    main()
