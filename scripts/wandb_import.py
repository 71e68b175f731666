#!/usr/bin/env python3
"""Writes an Ember run as a Weights & Biases run.

W&B has no Rust client, and `wandb sync` (0.30 and later) no longer reads TensorBoard files, so
this script replays a run directory's `metrics.jsonl` through the `wandb` package: every row at
its own step (`_step` is Ember's step), the resolved recipe (`recipe.resolved.toml`) as the run's
config, and the run's name and project. It runs offline unless WANDB_MODE says otherwise, writing
`<run dir>/wandb/offline-run-*`, which `wandb sync <that folder>` uploads once the machine has a
key and the network.

    pip install wandb
    python scripts/wandb_import.py runs/arithmetic-cpu [--project ember] [--name NAME]
    wandb sync runs/arithmetic-cpu/wandb/offline-run-*

It reads a finished or stopped run; for a run still going, run it again afterwards into a new
W&B run (W&B keeps one history per run and does not take steps older than its last).
"""

import argparse
import json
import os
import sys
import tomllib


def rows(path):
    """The complete lines of metrics.jsonl (a torn last line is left out), each a dict."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="an Ember run directory (it holds metrics.jsonl)")
    p.add_argument("--project", default="ember", help="the W&B project (default: ember)")
    p.add_argument("--name", help="the W&B run's name (default: the run directory's name)")
    p.add_argument("--entity", help="the W&B entity (default: the account's)")
    a = p.parse_args()
    metrics = os.path.join(a.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"{metrics} not found: is {a.run_dir} an Ember run directory?")
    recipe = os.path.join(a.run_dir, "recipe.resolved.toml")
    config = {}
    if os.path.isfile(recipe):
        with open(recipe, "rb") as f:
            config = tomllib.load(f)
    try:
        import wandb
    except ImportError:
        sys.exit("the wandb package is missing: pip install wandb")
    name = a.name or os.path.basename(os.path.abspath(a.run_dir))
    mode = os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        project=a.project,
        entity=a.entity,
        name=name,
        config=config,
        mode=mode,
        dir=a.run_dir,
        job_type="train",
    )
    last = -1
    for row in rows(metrics):
        step = row.pop("step", None)
        step = last + 1 if step is None else int(step)
        if step <= last:
            # A W&B history only moves forward; an earlier step's row was logged already.
            continue
        row = {k: (float("nan") if v is None else v) for k, v in row.items()}
        run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
        last = step
    run.finish()
    print(f"wrote {run.dir}")
    if mode == "offline":
        print(f"upload it with: wandb sync {os.path.dirname(run.dir)}")


if __name__ == "__main__":
    main()
