"""Plots the sample-efficiency study run by scripts/flow_study.sh and prints its table (docs/src/images-study.md).

Reads runs/flow-study/{class,jpeg}-{method}-s{seed}/metrics.jsonl (the evaluation rows: 320
digits from fixed noise, 20-step Euler ODE) and recipe.resolved.toml (images per step =
prompts_per_step x samples_per_prompt), writes docs/src/flow_study.png and prints markdown.

Usage (matplotlib in any venv): python scripts/plot_flow_study.py [runs/flow-study]
"""

import json
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/flow-study")
METHODS = ["ram", "flow-grpo", "loop", "ddpo"]
LABEL = {"ram": "RAM", "flow-grpo": "Flow-GRPO", "loop": "LOOP", "ddpo": "DDPO"}
COLOR = {"ram": "C3", "flow-grpo": "C0", "loop": "C2", "ddpo": "C1"}


def load(reward, method, seed):
    d = ROOT / f"{reward}-{method}-s{seed}"
    if not (d / "summary.json").is_file():
        return None
    r = tomllib.loads((d / "recipe.resolved.toml").read_text())
    per_step = r["rl"]["prompts_per_step"] * r["rl"]["samples_per_prompt"]
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if "eval/accuracy" in row]
    return {
        "images": [int(row["step"]) * per_step for row in evals],
        "accuracy": [row["eval/accuracy"] for row in evals],
        "jpeg_kb": [row["eval/jpeg_kb"] for row in evals],
        "diversity": [row["eval/diversity"] for row in evals],
        "seconds": json.loads((d / "summary.json").read_text())["finetune_seconds"],
    }


def seeds_of(reward, method):
    out = {}
    for seed in range(8):
        run = load(reward, method, seed)
        if run is not None:
            out[seed] = run
    return out


def mean_curve(runs, key):
    """Mean over seeds at the images every seed has."""
    common = sorted(set.intersection(*(set(r["images"]) for r in runs.values())))
    return common, [
        sum(r[key][r["images"].index(n)] for r in runs.values()) / len(runs) for n in common
    ]


def main():
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = [
        ("class", "accuracy", "class accuracy (requested digit)", axes[0]),
        ("jpeg", "jpeg_kb", "JPEG size, kB (compressibility: lower is better)", axes[1]),
    ]
    table = {}
    for reward, key, title, ax in panels:
        for m in METHODS:
            runs = seeds_of(reward, m)
            if not runs:
                continue
            for seed, r in runs.items():
                ax.plot(r["images"], r[key], color=COLOR[m], alpha=0.3, lw=1)
            xs, ys = mean_curve(runs, key)
            ax.plot(xs, ys, color=COLOR[m], lw=2.2, label=f"{LABEL[m]} ({len(runs)} seeds)")
            table[(reward, m)] = runs
        ax.set_xlabel("images generated for training")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "Digits flow DiT, LoRA fine-tuning, guidance 1: thin lines per seed, thick the mean",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path("docs/src/flow_study.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}\n")

    # Table: accuracy at a few budgets and the images to the first +10 points (mean of seeds).
    print("| method | seeds | acc. at 0 | 2 000 images | 4 000 | 8 000 | 16 000 | "
          "images to +10 pts (each seed) | diversity at 16 000 | fine-tune s (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in METHODS:
        runs = table.get(("class", m))
        if not runs:
            continue
        xs, ys = mean_curve(runs, "accuracy")
        at = lambda n: f"{ys[xs.index(n)]:.3f}" if n in xs else "–"  # noqa: E731
        reach = []
        for r in runs.values():
            goal = r["accuracy"][0] + 0.10
            hit = next((n for n, a in zip(r["images"], r["accuracy"]) if a >= goal), None)
            reach.append(f"{hit:,}" if hit is not None else "not reached")
        _, div = mean_curve(runs, "diversity")
        secs = sum(r["seconds"] for r in runs.values()) / len(runs)
        print(f"| {LABEL[m]} | {len(runs)} | {at(0)} | {at(2000)} | {at(4000)} | {at(8000)} "
              f"| {at(16000)} | {' / '.join(reach)} | {div[-1]:.2f} | {secs:.0f} |")
    print()
    print("| method | seeds | JPEG kB at 0 | 800 images | 1 600 | 2 400 | 4 800 | "
          "diversity at 4 800 | accuracy at 4 800 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in METHODS:
        runs = table.get(("jpeg", m))
        if not runs:
            continue
        xs, ys = mean_curve(runs, "jpeg_kb")
        _, div = mean_curve(runs, "diversity")
        _, acc = mean_curve(runs, "accuracy")
        at = lambda n: f"{ys[xs.index(n)]:.3f}" if n in xs else "–"  # noqa: E731
        print(f"| {LABEL[m]} | {len(runs)} | {at(0)} | {at(800)} | {at(1600)} | {at(2400)} "
              f"| {at(4800)} | {div[-1]:.2f} | {acc[-1]:.3f} |")


if __name__ == "__main__":
    main()
