"""Makes the lm-eval-harness task data and its reference results.

Writes recipes/lm-eval/arith.jsonl (20 additions of two numbers below 50, four choices each,
from a fixed seed) and tests/fixtures/llm/lm_eval_hf.json: what lm-eval-harness 0.4.13's own
`hf` backend (transformers' GGUF loader, float32, CPU) gives on the tasks in recipes/lm-eval/
for SmolLM2-135M-Instruct Q4_1: each document's log-likelihood and greedy flag per choice, each
generation, and the task metrics. tests/serve.rs runs the unmodified `lm_eval` CLI against
`ember serve` on the same file and compares. Run from the repository root with
`lm-eval[hf]==0.4.13`, torch, transformers and gguf installed (never part of CI):

    python scripts/make_lm_eval_fixtures.py --gguf PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os
import random

DATA = os.path.join("recipes", "lm-eval", "arith.jsonl")
OUT = os.path.join("tests", "fixtures", "llm", "lm_eval_hf.json")
TASKS = ["ember_arith", "ember_arith_gen"]


def write_data():
    rng = random.Random(35)
    rows = []
    for _ in range(20):
        a, b = rng.randint(1, 49), rng.randint(1, 49)
        s = a + b
        wrong = rng.sample([d for d in (-11, -10, -2, -1, 1, 2, 9, 10) if s + d > 0], 3)
        choices = [str(s)] + [str(s + d) for d in wrong]
        rng.shuffle(choices)
        rows.append({"a": a, "b": b, "sum": str(s), "choices": choices,
                     "label": choices.index(str(s))})
    with open(DATA, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def per_doc(samples):
    """A task's samples as lm-eval logs them, reduced to what the test compares."""
    out = {}
    for s in samples:
        resps = [r[0] for r in s["resps"]]
        if isinstance(resps[0], str):
            out[str(s["doc_id"])] = {"generation": resps[0]}
        else:
            out[str(s["doc_id"])] = {
                "loglikelihoods": [float(r[0]) for r in resps],
                "greedy": [bool(r[1]) for r in resps],
            }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    args = ap.parse_args()
    write_data()
    import lm_eval
    from lm_eval.tasks import TaskManager

    gguf = os.path.abspath(args.gguf)
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={os.path.dirname(gguf)},gguf_file={os.path.basename(gguf)},"
        "dtype=float32",
        tasks=TASKS,
        task_manager=TaskManager(include_path=os.path.join("recipes", "lm-eval")),
        batch_size=1,
        device="cpu",
        log_samples=True,
    )
    fixture = {"lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "0.4.13",
               "backend": "hf, gguf_file, float32", "tasks": {}}
    for t in TASKS:
        metrics = {k: v for k, v in res["results"][t].items()
                   if isinstance(v, (int, float)) and "stderr" not in k}
        fixture["tasks"][t] = {"metrics": metrics, "docs": per_doc(res["samples"][t])}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(json.dumps({t: fixture["tasks"][t]["metrics"] for t in TASKS}))


if __name__ == "__main__":
    main()
