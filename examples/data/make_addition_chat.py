"""Writes addition-chat.jsonl: 2-digit additions as a chat-format dataset (a `messages` list, the
answer under `solution`, an extra column `carry`), for the README's TRL-style example. Seeded,
so the file is the same on every run: python3 examples/data/make_addition_chat.py"""

import json
import os
import random

rng = random.Random(0)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "addition-chat.jsonl"), "w") as out:
    for _ in range(2000):
        a, b = rng.randrange(100), rng.randrange(100)
        line = {
            "messages": [{"role": "user", "content": f"{a}+{b}="}],
            "solution": a + b,
            "carry": (a % 10) + (b % 10) >= 10,
        }
        out.write(json.dumps(line) + "\n")
