"""Hostile helper programs against `ember train`: the environment and reward protocols.

    python3 scripts/fuzz_protocols.py --out /tmp/fuzz-protocols.json [--timeout 120]
        [--ember target/release/ember]

Each try runs one short training run whose external environment (an agent recipe) or external
reward program (the main job's recipe) misbehaves in one way, from its first answer or from
its second: text that is not JSON, wrong counts and types, non-finite and huge numbers, deep
nesting, invalid UTF-8, an extra answer line, an endless line, silence past the timeout, an
exit, a closed stdout, a child that keeps the pipe open, enormous observations, thousands of
reward components. The program itself is a small Python file written per try. Each outcome is
`refused` (a non-zero exit with an error line, no panic), `ran` (exit 0: the note says whether
that was right), `panic`, `abort` (killed by a signal), `hang` (past --timeout), and the peak
memory of the trainer (its `VmHWM`, polled) is kept. Prints the counts and writes every try to
--out.
"""

import argparse
import json
import os
import subprocess
import tempfile
import textwrap

import fuzz_common
import time

# What the program answers instead of a good line (Python expressions of `good`, the dict a
# correct answer would be; `key`, its list's key; `n`, the list's length).
BAD = {
    "none": "print(json.dumps(good), flush=True)",
    "not_json": "print('hello', flush=True)",
    "debug_first": "print('debug: scoring', flush=True); print(json.dumps(good), flush=True)",
    "extra_line": "print(json.dumps(good), flush=True); print(json.dumps(good), flush=True)",
    "empty_object": "print('{}', flush=True)",
    "json_array": "print('[1, 2]', flush=True)",
    "short": "good[key] = good[key][:-1]; print(json.dumps(good), flush=True)",
    "long": "good[key] = good[key] * 2; print(json.dumps(good), flush=True)",
    "null_list": "good[key] = None; print(json.dumps(good), flush=True)",
    "strings": "good[key] = ['x'] * n; print(json.dumps(good), flush=True)",
    "nested": "good[key] = [[1]] * n; print(json.dumps(good), flush=True)",
    "nan": "print(json.dumps(good).replace('0.5', 'NaN'), flush=True)",
    "huge": "print(json.dumps(good).replace('0.5', '1e300'), flush=True)",
    "overflow": "print(json.dumps(good).replace('0.5', '1e999'), flush=True)",
    "deep": "print('[' * 200000 + ']' * 200000, flush=True)",
    "utf8": "sys.stdout.buffer.write(b'\\xff\\xfe' + json.dumps(good).encode() + b'\\n'); "
            "sys.stdout.flush()",
    "trailing": "print(json.dumps(good) + ' xyz', flush=True)",
    "big_valid": "good['pad'] = 'p' * 50_000_000; print(json.dumps(good), flush=True)",
    "endless": "chunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)",
    "silent": "time.sleep(3600)",
    "exit": "sys.exit(3)",
    "close_stdout": "os.close(1); time.sleep(3600)",
    "orphan_holds_pipe": "subprocess.Popen(['sleep', '3600']); sys.exit(0)",
    "kill_self": "os.kill(os.getpid(), 9)",
}

# Reward-only and environment-only misbehaviours.
BAD_REWARD = {
    "components_10k": "good['components'] = {f'c{i}': [0.5] * n for i in range(10000)}; "
                      "print(json.dumps(good), flush=True)",
    "metric_names_per_step": "good['metrics'] = {f'm{step}_{i}': 1.0 for i in range(500)}; "
                             "print(json.dumps(good), flush=True)",
    "bad_component_name": "good['components'] = {'a/b': [0.5] * n}; "
                          "print(json.dumps(good), flush=True)",
    "metric_string": "good['metrics'] = {'m': 'x'}; print(json.dumps(good), flush=True)",
    "all_null": "good[key] = [None] * n; print(json.dumps(good), flush=True)",
}
BAD_ENV = {
    "huge_observation": "good[key] = [dict(e, observation='o' * 1_000_000) if isinstance(e, dict)"
                        " else 'o' * 1_000_000 for e in good[key]]; "
                        "print(json.dumps(good), flush=True)",
    "number_observation": "good[key] = [dict(e, observation=7) if isinstance(e, dict) else 7 "
                          "for e in good[key]]; print(json.dumps(good), flush=True)",
    "never_done": "good[key] = [dict(e, done=False) if isinstance(e, dict) else e "
                  "for e in good[key]]; print(json.dumps(good), flush=True)",
    "done_string": "good[key] = [dict(e, done='yes') if isinstance(e, dict) else e "
                   "for e in good[key]]; print(json.dumps(good), flush=True)",
    "reward_string": "good[key] = [dict(e, reward='1') if isinstance(e, dict) else e "
                     "for e in good[key]]; print(json.dumps(good), flush=True)",
    "no_fields": "good[key] = [{} if isinstance(e, dict) else e for e in good[key]]; "
                 "print(json.dumps(good), flush=True)",
}

PROGRAM = """\
import json, os, subprocess, sys, time
AT = {at}
count = 0
for line in sys.stdin:
    req = json.loads(line)
    step = req.get("step", count)
    {good}
    if count >= AT:
{bad}
    else:
        print(json.dumps(good), flush=True)
    count += 1
"""

GOOD_REWARD = ("key = 'rewards'; n = len(req['items']); "
               "good = {'rewards': [0.5 if i % 2 else 1.0 for i in range(n)]}")
GOOD_ENV = ("key = 'observations' if req['op'] == 'reset' else 'feedback'; "
            "n = len(req['episodes'] if req['op'] == 'reset' else req['actions']); "
            "good = {'observations': ['guess:'] * n} if req['op'] == 'reset' else "
            "{'feedback': [{'observation': '', 'reward': 0.5, 'done': True}] * n}")

TRAIN = """\
max_new_tokens = 3
temperature = 1.0
[train]
steps = 3
lr = 1e-3
eval_every = 100
"""

MODEL = """\
[model]
d_model = 32
layers = 1
heads = 2
kv_heads = 1
d_ff = 64
"""

REWARD_RECIPE = """\
name = "fuzz-reward"
seed = 0
device = "auto"
algorithm = "grpo"
{model}[task]
digits = 1
ops = "+"
eval_size = 8
[warmup]
steps = 1
batch = 4
lr = 1e-3
[rollout]
prompts_per_step = 4
samples_per_prompt = 4
{train}[reward]
correct = 0.0
[reward.external]
command = ["python3", "{program}"]
timeout_s = 3
"""

ENV_RECIPE = """\
kind = "agent"
name = "fuzz-env"
seed = 0
device = "auto"
algorithm = "grpo"
eval_episodes = 4
{model}vocab = "bytes"
[env]
kind = "external"
command = ["python3", "{program}"]
timeout_s = 3
[rollout]
prompts_per_step = 4
samples_per_prompt = 4
max_turns = 3
{train}"""


def hwm_kib(pid):
    """The process's peak resident memory so far (VmHWM), in KiB; None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run(ember, recipe, timeout):
    out = tempfile.mkdtemp(prefix="ember-fuzzp-")
    cmd = [ember, "train", recipe, "--quiet", "--out", out]
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
        start, peak = time.monotonic(), 0
        while p.poll() is None and time.monotonic() - start < timeout:
            peak = max(peak, hwm_kib(p.pid) or 0)
            time.sleep(0.05)
        if p.poll() is None:
            p.kill()
            p.wait()
            subprocess.run(["rm", "-rf", out])
            return "hang", "", peak
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
    subprocess.run(["rm", "-rf", out])
    err = stderr.strip().splitlines()
    last = err[-1] if err else ""
    if p.returncode < 0:
        kind = "abort"
    elif "panicked" in stderr or p.returncode == 101:
        kind = "panic"
    elif p.returncode == 0:
        kind = "ran"
    else:
        kind = "refused"
    return kind, last[-400:], peak


def tries():
    for side, extra in (("reward", BAD_REWARD), ("env", BAD_ENV)):
        for name, bad in {**BAD, **extra}.items():
            for at in (0, 1):
                yield side, name, bad, at


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--ember", default="target/release/ember")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ember-fuzzp-work-")
    results = []
    for side, name, bad, at in tries():
        good = GOOD_REWARD if side == "reward" else GOOD_ENV
        program = os.path.join(work, f"{side}-{name}-{at}.py")
        with open(program, "w") as f:
            f.write(PROGRAM.format(at=at, good=good,
                                   bad=textwrap.indent(bad, " " * 8)))
        recipe = os.path.join(work, f"{side}-{name}-{at}.toml")
        with open(recipe, "w") as f:
            text = REWARD_RECIPE if side == "reward" else ENV_RECIPE
            f.write(text.replace("{model}", MODEL).replace("{train}", TRAIN)
                    .replace("{program}", program))
        kind, last, rss = run(a.ember, recipe, a.timeout)
        results.append({"side": side, "mode": name, "at": at, "outcome": kind,
                        "stderr": last, "max_rss_kib": rss})
        print(f"{kind:8} {side:6} {name:22} at={at} rss={rss}  {last[-160:]}", flush=True)
        if name == "none" and kind != "ran":
            raise SystemExit(f"the well-behaved {side} program's run did not succeed: {last}")
    fuzz_common.write_counts(a.out, results)


if __name__ == "__main__":
    main()
