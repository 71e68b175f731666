"""An RL loop written against the `tinker` SDK as a user writes one (the shape of
tinker-cookbook's `rl_loop.py`): sample a group per prompt from the current weights, reward
exact answers, centre the rewards within each group, and train with `importance_sampling`.
Held-out greedy accuracy is measured before and after.

The task is the main job's (2-digit addition on its character-level model); run it against
`ember serve --tinker` serving the main job's warmed-up model (scripts/tinker_rl_study.sh does
both):

    python scripts/tinker_rl_loop.py --base-url http://127.0.0.1:8000 --model arith \
        --tokenizer runs/arith-warm/final/tokenizer.json --steps 60 --seed 0 --out result.json

Needs only the `tinker` package (`pip install tinker==0.38.0`).
"""

import argparse
import json
import random
import time

import tinker
from tinker import types

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--api-key", default="tml-local")
p.add_argument("--model", required=True)
p.add_argument("--tokenizer", required=True, help="the model's tokenizer.json (a character vocabulary)")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--rank", type=int, default=16)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--groups", type=int, default=32)
p.add_argument("--group-size", type=int, default=8)
p.add_argument("--eval-size", type=int, default=200)
p.add_argument("--out", required=True)
args = p.parse_args()

vocab = json.load(open(args.tokenizer))["model"]["vocab"]
inverse = {i: c for c, i in vocab.items()}
BOS, EOS = vocab["<bos>"], vocab["<eos>"]


def encode(text):
    return [BOS] + [vocab[c] for c in text]


def decode(ids):
    return "".join(inverse.get(i, "?") for i in ids if i != EOS)


def held_out(a, b):
    """One problem in ten, fixed by a hash of the pair (never trained on)."""
    return random.Random(a * 100 + b).random() < 0.1


def problems(rng, n, want_held_out):
    out = []
    while len(out) < n:
        a, b = rng.randrange(100), rng.randrange(100)
        if held_out(a, b) == want_held_out:
            out.append((a, b))
    return out


every_held_out = [(a, b) for a in range(100) for b in range(100) if held_out(a, b)]
eval_set = random.Random(12345).sample(every_held_out, min(args.eval_size, len(every_held_out)))
rng = random.Random(args.seed)
service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
training = service.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed,
                                               train_unembed=False).result()
greedy = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[EOS])


def accuracy(sampler):
    futures = [sampler.sample(prompt=types.ModelInput.from_ints(encode(f"{a}+{b}=")), num_samples=1,
                              sampling_params=greedy) for a, b in eval_set]
    right = sum(decode(f.result().sequences[0].tokens) == str(a + b) for f, (a, b) in zip(futures, eval_set))
    return right / len(eval_set)


start = time.time()
before = accuracy(training.save_weights_and_get_sampling_client().result())
curve = []
phases = {"save_for_sampler": 0.0, "sample": 0.0, "train": 0.0}
params = types.SamplingParams(max_tokens=5, temperature=1.0, stop=[EOS])
adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip_norm=1.0)
for step in range(args.steps):
    t0 = time.time()
    sampler = training.save_weights_and_get_sampling_client().result()
    t1 = time.time()
    batch = problems(rng, args.groups, False)
    futures = [sampler.sample(prompt=types.ModelInput.from_ints(encode(f"{a}+{b}=")),
                              num_samples=args.group_size, sampling_params=params) for a, b in batch]
    datums, rewards = [], []
    for f, (a, b) in zip(futures, batch):
        seqs = f.result().sequences
        r = [float(decode(s.tokens) == str(a + b)) for s in seqs]
        rewards += r
        mean = sum(r) / len(r)
        prompt = encode(f"{a}+{b}=")
        for s, ri in zip(seqs, r):
            if ri == mean:
                continue  # no signal in this sample (its group is all right or all wrong)
            tokens = prompt + s.tokens
            n = len(prompt) - 1
            datums.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * n + list(s.logprobs),
                    "advantages": [0.0] * n + [ri - mean] * len(s.tokens),
                },
            ))
    t2 = time.time()
    if datums:
        training.forward_backward(datums, "importance_sampling").result()
        training.optim_step(adam).result()
    t3 = time.time()
    for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
        phases[k] += dt
    curve.append(sum(rewards) / len(rewards))
after = accuracy(training.save_weights_and_get_sampling_client().result())
result = {"seed": args.seed, "accuracy_before": before, "accuracy_after": after,
          "train_reward": curve, "seconds": round(time.time() - start, 1), "steps": args.steps,
          "step_s": round(sum(phases.values()) / args.steps, 4),
          "phase_s": {k: round(v / args.steps, 4) for k, v in phases.items()}}
json.dump(result, open(args.out, "w"))
print(json.dumps({k: v for k, v in result.items() if k != "train_reward"}))
