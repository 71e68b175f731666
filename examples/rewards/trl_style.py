"""Reward functions written as TRL users write them (no dependencies), for the README's example:
exact match against the dataset's `solution` column, and a bonus that applies only to additions
with a carry (None elsewhere), read from the dataset's extra column `carry`. The dataset is
conversational (a `messages` prompt), so, as in TRL's `GRPOTrainer`, each completion arrives as
`[{"role": "assistant", "content": ...}]`; these functions run unchanged under TRL."""


def exact(completions, solution, **kwargs):
    return [1.0 if c[0]["content"].strip() == str(s) else 0.0 for c, s in zip(completions, solution)]


def carry_bonus(completions, solution, carry, **kwargs):
    return [
        (1.0 if c[0]["content"].strip() == str(s) else 0.0) if k else None
        for c, s, k in zip(completions, solution, carry)
    ]
