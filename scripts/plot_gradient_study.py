"""Plots of the gradient-estimator study (`cargo bench --bench gradient_estimators`).

    cargo bench --bench gradient_estimators -- target/gradient_study.json
    cargo bench --bench gradient_estimators -- learn 3     # writes target/learning_study.json
    python scripts/plot_gradient_study.py target/gradient_study.json target/learning_study.json

writes docs/src/gradient_study.png (the bias and the variance of each estimator across launch
angles on the ball with a wall, and the gradient-ascent curves, mean of three seeds, on both
tasks) and, given the second file, docs/src/gradient_learning.png (the policies' learning
curves on the pendulum and the cart-pole, every seed).
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = ["first", "zeroth", "ddcg", "ivw"]
STYLES = ["-o", "-s", "--^", ":x"]


def main():
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "target/gradient_study.json")
    tasks = {t["task"]: t for t in json.loads(path.read_text())}
    wall = tasks["wall"]
    theta = [p["theta"] for p in wall["points"]]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for i, (name, style) in enumerate(zip(NAMES, STYLES)):
        axes[0].semilogy(theta, [max(p["bias"][i], 1e-9) for p in wall["points"]], style, label=name, ms=3)
        axes[1].semilogy(theta, [max(p["variance"][i], 1e-12) for p in wall["points"]], style, label=name, ms=3)
        for ax, task in ((axes[2], wall), (axes[3], tasks["smooth"])):
            runs = task["curves"][i]
            mean = [sum(c[k] for c in runs) / len(runs) for k in range(len(runs[0]))]
            ax.plot(mean, style, label=name, ms=2, markevery=10)
    for ax in axes[:2]:
        for j in wall["jumps"]:
            ax.axvline(j, color="grey", lw=0.8)
        ax.set_xlabel("launch angle θ (rad); grey: the jumps")
    axes[0].set_ylabel("|bias| of the gradient estimate (wall)")
    axes[1].set_ylabel("variance of the gradient estimate (wall)")
    axes[2].set_ylabel("landing distance, wall (mean of 3 seeds)")
    axes[3].set_ylabel("landing distance, no wall (mean of 3 seeds)")
    for ax in axes[2:]:
        ax.set_xlabel("gradient-ascent step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Ball with a wall (Suh et al. 2022): first-order, zeroth-order, DDCG and IVW gradients, σ = 0.05, 100 samples")
    fig.tight_layout()
    out = Path(__file__).resolve().parent.parent / "docs/src/gradient_study.png"
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")
    if len(sys.argv) > 2:
        learning(Path(sys.argv[2]))


def learning(path):
    tasks = json.loads(path.read_text())
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4))
    for ax, task in zip(axes, tasks):
        for i, (name, style) in enumerate(zip(NAMES, STYLES)):
            for k, run in enumerate(task["curves"][i]):
                x = [j * task["every"] for j in range(len(run))]
                ax.plot(x, run, style, color=f"C{i}", ms=3, alpha=0.8, label=name if k == 0 else None)
        ax.set_title(f"{task['task']}, {task['horizon']}-step episodes")
        ax.set_xlabel("update")
        ax.set_ylabel("return of the mean action (32 fixed starts)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Policy learning with first-order, zeroth-order (the engine's REINFORCE), DDCG and IVW-H gradients; every seed")
    fig.tight_layout()
    out = Path(__file__).resolve().parent.parent / "docs/src/gradient_learning.png"
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
