"""A supervised loop written against the `tinker` SDK as a user writes one (the shape of
tinker-cookbook's `sl_loop.py`): chat examples rendered by the model's chat template, the loss on
the assistant's tokens only (`cross_entropy` with weights 0 on the prompt), AdamW, and the
held-out loss per token before and after.

Data: GSM8K's training file (question → worked answer). The chat template is the server's
(`POST /tokenize` with `messages`, which `ember serve` answers for any model it serves, a GGUF
file included), so the loop needs no tokenizer of its own:

    ember serve --model SmolLM2-135M-Instruct.Q4_1.gguf --served-model-name smol --tinker &
    python scripts/tinker_sl_loop.py --base-url http://127.0.0.1:8000 --model smol \
        --data ../shared/data/gsm8k/train.jsonl --steps 30 --seed 0 --out sl.json
"""

import argparse
import json
import random
import time
import urllib.request

import tinker
from tinker import types

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--api-key", default="tml-local")
p.add_argument("--model", required=True)
p.add_argument("--data", required=True, help="JSONL with question and answer")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--rank", type=int, default=16)
p.add_argument("--lr", type=float, default=2e-4)
p.add_argument("--eval-size", type=int, default=32)
p.add_argument("--max-tokens", type=int, default=256)
p.add_argument("--out", required=True)
args = p.parse_args()


def tokenize(messages, add_generation_prompt):
    body = json.dumps({"messages": messages, "add_generation_prompt": add_generation_prompt}).encode()
    req = urllib.request.Request(args.base_url + "/tokenize", data=body, method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {args.api_key}"})
    return json.load(urllib.request.urlopen(req))["tokens"]


def datum(row):
    user = [{"role": "user", "content": row["question"]}]
    prompt = tokenize(user, True)
    full = tokenize(user + [{"role": "assistant", "content": row["answer"]}], False)[: args.max_tokens]
    n = len(full) - 1
    weights = [0.0 if i + 1 < len(prompt) else 1.0 for i in range(n)]
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "weights": weights})


rows = [json.loads(line) for line in open(args.data)]
random.Random(1234).shuffle(rows)
held_out, train = rows[: args.eval_size], rows[args.eval_size:]
eval_data = [datum(r) for r in held_out]
rng = random.Random(args.seed)
service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
training = service.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed,
                                               train_unembed=False).result()
adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)


def held_out_loss():
    out = training.forward(eval_data, "cross_entropy").result()
    tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in eval_data)
    return out.metrics["loss:sum"] / tokens


start = time.time()
before = held_out_loss()
losses = []
for step in range(args.steps):
    batch = [datum(r) for r in rng.sample(train, args.batch)]
    fb = training.forward_backward(batch, "cross_entropy").result()
    tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
    training.optim_step(adam).result()
    losses.append(fb.metrics["loss:sum"] / tokens)
after = held_out_loss()
result = {"seed": args.seed, "held_out_loss_before": before, "held_out_loss_after": after,
          "train_loss": losses, "seconds": round(time.time() - start, 1), "steps": args.steps}
json.dump(result, open(args.out, "w"))
print(json.dumps({k: v for k, v in result.items() if k != "train_loss"}))
