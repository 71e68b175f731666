"""Table and plot of the RARL robustness study (scripts/rarl_study.sh).

Reads runs/rarl-study/{rarl,baseline}-s{seed}/summary.json and prints, for every (mass
multiplier, friction) of the evaluation grid, the mean return over seeds of the protagonist
trained with the adversary and of the one trained without it; then the grid's mean, the
nominal cell and how many cells each arm wins. Writes docs/src/rarl_study.png.

    python scripts/plot_rarl_study.py [runs/rarl-study]
"""

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(root):
    arms = {}
    for arm in ("rarl", "baseline"):
        runs = sorted(root.glob(f"{arm}-s*/summary.json"))
        arms[arm] = [json.loads(p.read_text()) for p in runs]
    return arms


def grid(summaries):
    """(mass, friction) -> [return per seed]."""
    cells = {}
    for s in summaries:
        for m, f, r in s["robustness"]:
            cells.setdefault((round(m, 3), round(f, 3)), []).append(r)
    return cells


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/rarl-study")
    arms = load(root)
    g = {arm: grid(s) for arm, s in arms.items()}
    seeds = {arm: len(s) for arm, s in arms.items()}
    masses = sorted({m for m, _ in g["rarl"]})
    frictions = sorted({f for _, f in g["rarl"]})
    mean = statistics.mean
    print(f"seeds: RARL {seeds['rarl']}, baseline {seeds['baseline']}")
    print("| mass × \\ friction | " + " | ".join(f"{f:g}" for f in frictions) + " |")
    print("|---" * (len(frictions) + 1) + "|")
    wins = 0
    for m in masses:
        cells = []
        for f in frictions:
            a, b = mean(g["rarl"][(m, f)]), mean(g["baseline"][(m, f)])
            wins += a > b
            cells.append(f"{a:.0f} / {b:.0f}")
        print(f"| {m:g} | " + " | ".join(cells) + " |")
    n = len(masses) * len(frictions)
    all_a = [mean(v) for v in g["rarl"].values()]
    all_b = [mean(v) for v in g["baseline"].values()]
    print(f"grid mean: RARL {mean(all_a):.1f}, baseline {mean(all_b):.1f}; RARL higher in {wins}/{n} cells")
    for arm in ("rarl", "baseline"):
        nominal = g[arm][(1.0, 0.0)]
        sd = statistics.stdev(nominal) if len(nominal) > 1 else 0.0
        after = [s["after"] for s in arms[arm]]
        print(f"{arm}: nominal {mean(nominal):.1f} ± {sd:.1f} (seeds {[round(x) for x in nominal]}); eval after {[round(x) for x in after]}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arm, style in (("rarl", "-o"), ("baseline", "--s")):
        axes[0].plot(masses, [mean(g[arm][(m, 0.0)]) for m in masses], style, label=arm)
        axes[1].plot(frictions, [mean(g[arm][(1.0, f)]) for f in frictions], style, label=arm)
    axes[0].set_xlabel("pendulum mass multiplier (friction 0)")
    axes[1].set_xlabel("joint friction b (mass 1)")
    for ax in axes:
        ax.set_ylabel(f"mean return, {seeds['rarl']} seeds")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Pendulum swing-up: protagonist trained with RARL's adversary vs without")
    fig.tight_layout()
    out = Path(__file__).resolve().parent.parent / "docs/src/rarl_study.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
