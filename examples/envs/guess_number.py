"""The built-in guessing game (ember's `GuessNumber`) as an external environment: Ember's
JSON-lines environment protocol in plain Python (no dependencies).

    [env.external]
    command = ["python3", "examples/envs/guess_number.py", "--max", "31", "--turns", "6"]

Requests on stdin, one per line: {"op": "reset", "episodes": [{"id", "seed"}]} -> {"observations"};
{"op": "step", "actions": [{"id", "action"}]} -> {"feedback": [{"observation", "reward", "done"}]}.
The secret comes from the seed with the same SplitMix64 draw as the built-in, so both give the
same episodes.
"""

import argparse
import json
import sys

MASK = (1 << 64) - 1
DIGITS = "0123456789"


def splitmix64(state):
    """One SplitMix64 step: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def secret(seed, top):
    _, draw = splitmix64(seed ^ 0x6E55)
    return draw % (top + 1)


def last_number(text):
    """The guess, read as Ember's `reward::last_number` + `parse_number` read it: the last run of
    digits, dots and commas that ends in a digit, with a '-' just before it, commas dropped;
    None when that is not a number (e.g. `1.2.3`)."""
    end = len(text)
    while end > 0 and text[end - 1] not in DIGITS:
        end -= 1
    if end == 0:
        return None
    start = end
    while start > 0 and text[start - 1] in DIGITS + ".,":
        start -= 1
    while start < end and text[start] not in DIGITS:
        start += 1
    if start > 0 and text[start - 1] == "-":
        start -= 1
    token = text[start:end].replace(",", "")
    try:
        value = float(token)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max", type=int, default=31)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    running = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req["op"] == "reset":
            out = []
            for ep in req["episodes"]:
                running[ep["id"]] = [secret(ep["seed"], args.max), 0]
                out.append(f"0,{args.max}=")
            answer = {"observations": out}
        elif req["op"] == "step":
            feedback = []
            for act in req["actions"]:
                state = running[act["id"]]
                state[1] += 1
                guess = last_number(act["action"])
                if guess is not None and guess == state[0]:
                    fb = {"observation": "", "reward": 1.0, "done": True}
                elif state[1] >= args.turns:
                    fb = {"observation": "", "reward": 0.0, "done": True}
                elif guess is None:
                    fb = {"observation": ",", "reward": 0.0, "done": False}
                else:
                    fb = {"observation": "+," if state[0] > guess else "-,",
                          "reward": 0.0, "done": False}
                if fb["done"]:
                    del running[act["id"]]
                feedback.append(fb)
            answer = {"feedback": feedback}
        else:
            sys.exit(f"guess_number.py: unknown op {req['op']!r}")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
