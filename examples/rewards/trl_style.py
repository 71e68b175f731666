"""TRL-style reward functions for the README's example (no dependencies):
exact match against the dataset's answer, and a bonus that applies only to additions with a
carry (None elsewhere), read from the dataset's extra column `carry`."""


def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def carry_bonus(prompts, completions, answer, carry, **kwargs):
    return [
        (1.0 if c.strip() == str(a) else 0.0) if k else None
        for c, a, k in zip(completions, answer, carry)
    ]
