"""What the adversarial drivers (`fuzz_set.py`, `fuzz_serve.py`, `fuzz_protocols.py`) share."""

import json


def write_counts(path, tries, **extra):
    """Counts the tries by outcome, prints the counts, and writes them with every try (and
    `extra`) to `path` as JSON."""
    counts = {}
    for t in tries:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    with open(path, "w") as f:
        json.dump({**extra, "counts": counts, "tries": tries}, f, indent=1)
    print(json.dumps(counts))
