"""TRL-style reward functions for GSM8K-style answers, checked with Hugging Face's math-verify
(PyPI `math-verify`). Use them from a recipe:

    [reward.python]
    functions = ["examples/rewards/gsm8k_math_verify.py:accuracy",
                 "examples/rewards/gsm8k_math_verify.py:boxed=0.1"]
    python = "${EMBER_CACHE:-~/.cache/ember}/py/bin/python"
"""

import re

from math_verify import parse, verify


def accuracy(prompts, completions, answer, **kwargs):
    """1.0 when the completion's final answer equals the reference (as math-verify parses
    both: numbers, fractions, LaTeX), else 0.0."""
    rewards = []
    for completion, ref in zip(completions, answer):
        gold = parse(str(ref))
        if not gold:
            rewards.append(None)  # an unparseable reference: no reward for this sample
            continue
        pred = parse(completion)
        rewards.append(1.0 if pred and verify(gold, pred) else 0.0)
    return rewards


def boxed(prompts, completions, **kwargs):
    """1.0 when the completion puts its answer in \\boxed{...}, else 0.0."""
    return [1.0 if re.search(r"\\boxed\{[^}]*\}", c) else 0.0 for c in completions]
