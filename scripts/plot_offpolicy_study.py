"""Plot of the off-policy study (`scripts/offpolicy_study.sh`, docs/src/algorithms.md).

    PRESETS="grpo remax ppo" SEEDS="0 1 2" bash scripts/offpolicy_study.sh
    python scripts/plot_offpolicy_study.py grpo remax ppo
    python scripts/plot_offpolicy_study.py --dir runs/offpolicy-study-smollm2-lora-grpo \
        --regimes on,mb4 --out lora.png grpo topr

reads DIR/<preset>-<regime>-s<seed>/metrics.jsonl (DIR: runs/offpolicy-study) and writes OUT
(docs/src/offpolicy_study.png): one panel per preset, the held-out accuracy along the run in
each regime (on, mb4e2, stale2 unless --regimes says) less the warm-up's (the seeds start from
different warm-ups), the mean over the seeds found as a line and their range as a band, over the
evaluation steps every seed has.
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "on": "on-policy",
    "mb4e2": "4 mini-batches × 2 epochs",
    "mb4": "4 mini-batches",
    "stale2": "rollouts 2 updates stale",
}


def curves(root, preset, regime):
    """Each seed's {step: held-out accuracy − the warm-up's} of one preset and regime."""
    out = []
    for run in sorted(root.glob(f"{preset}-{regime}-s*")):
        metrics = run / "metrics.jsonl"
        if not metrics.exists():
            continue
        rows = [json.loads(line) for line in metrics.open()]
        points = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
        if points:
            out.append({s: a - points[0][1] for s, a in points})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*", default=["grpo", "remax", "ppo"])
    ap.add_argument("--dir", default="runs/offpolicy-study")
    ap.add_argument("--regimes", default="on,mb4e2,stale2")
    ap.add_argument("--out", default="docs/src/offpolicy_study.png")
    args = ap.parse_args()
    presets, root = args.presets, Path(args.dir)
    fig, axes = plt.subplots(1, len(presets), figsize=(4.2 * len(presets), 3.4), sharey=True)
    axes = [axes] if len(presets) == 1 else axes
    for ax, preset in zip(axes, presets):
        for i, regime in enumerate(args.regimes.split(",")):
            runs = curves(root, preset, regime)
            steps = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
            if not steps:
                continue
            label = LABELS.get(regime, regime)
            values = [[r[k] for r in runs] for k in steps]
            mean = [sum(v) / len(v) for v in values]
            ax.plot(steps, mean, color=f"C{i}", label=f"{label} ({len(runs)} seeds)")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values],
                            color=f"C{i}", alpha=0.15)
        ax.set_title(preset)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy − warm-up's")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    out = Path(args.out)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
