"""Writes addition-chat.jsonl: every 2-digit addition (10 000 lines, in a seeded order) as a
chat-format dataset (a `messages` list, the answer under `solution`, an extra column `carry`),
for recipes/addition-chat-python.toml. The file is the same on every run (not committed):
    python3 examples/data/make_addition_chat.py"""

import json
import os
import random

rng = random.Random(0)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "addition-chat.jsonl"), "w") as out:
    pairs = [(a, b) for a in range(100) for b in range(100)]
    rng.shuffle(pairs)
    for a, b in pairs:
        line = {
            "messages": [{"role": "user", "content": f"{a}+{b}="}],
            "solution": a + b,
            "carry": (a % 10) + (b % 10) >= 10,
        }
        out.write(json.dumps(line) + "\n")
