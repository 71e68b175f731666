"""Plot of the off-policy study (`scripts/offpolicy_study.sh`, docs/src/algorithms.md).

    PRESETS="grpo remax ppo" SEEDS="0 1 2" bash scripts/offpolicy_study.sh
    python scripts/plot_offpolicy_study.py grpo remax ppo

reads runs/offpolicy-study/<preset>-<regime>-s<seed>/metrics.jsonl and writes
docs/src/offpolicy_study.png: one panel per preset, the held-out accuracy along the run in each
regime (on, mb4e2, stale2) less the warm-up's (the seeds start from different warm-ups), the mean
over the seeds found as a line and their range as a band.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REGIMES = {
    "on": "on-policy",
    "mb4e2": "4 mini-batches × 2 epochs",
    "stale2": "rollouts 2 updates stale",
}
ROOT = Path("runs/offpolicy-study")


def curves(preset, regime):
    """Each seed's (step, held-out accuracy − the warm-up's) of one preset and regime."""
    out = []
    for run in sorted(ROOT.glob(f"{preset}-{regime}-s*")):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        points = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
        if points:
            out.append([(s, a - points[0][1]) for s, a in points])
    return out


def main():
    presets = sys.argv[1:] or ["grpo", "remax", "ppo"]
    fig, axes = plt.subplots(1, len(presets), figsize=(4.2 * len(presets), 3.4), sharey=True)
    axes = [axes] if len(presets) == 1 else axes
    for ax, preset in zip(axes, presets):
        for i, (regime, label) in enumerate(REGIMES.items()):
            runs = curves(preset, regime)
            if not runs:
                continue
            n = min(len(r) for r in runs)
            steps = [p[0] for p in runs[0][:n]]
            values = [[r[k][1] for r in runs] for k in range(n)]
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
    out = Path("docs/src/offpolicy_study.png")
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
