"""A GRPO-shaped step through the `tinker` SDK against `ember serve --tinker`, timed by phase,
for comparison with the same step run by `ember train` (benches/tinker_step.sh runs both).

The step: P GSM8K prompts rendered by the served model's chat template (`POST /tokenize`),
8 samples each with N new tokens at temperature 1, rewards (a number in the answer equal to the
reference's), advantages centred within each group, one `forward_backward` with
`importance_sampling` and one `optim_step` (LoRA r16, AdamW 1e-4). Prints one JSON line: the
seconds of each step and its phases.

    python benches/tinker_step.py BASE_URL MODEL GSM8K_JSONL [NEW=64] [PROMPTS=8] [STEPS=3]
"""

import json
import re
import sys
import time
import urllib.request

import tinker
from tinker import types

base_url, model, data = sys.argv[1], sys.argv[2], sys.argv[3]
new = int(sys.argv[4]) if len(sys.argv) > 4 else 64
prompts = int(sys.argv[5]) if len(sys.argv) > 5 else 8
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 3
key = "tml-bench"


def tokenize(question):
    body = json.dumps({"messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(base_url + "/tokenize", data=body, method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {key}"})
    return json.load(urllib.request.urlopen(req))["tokens"]


rows = [json.loads(line) for line in open(data)]
service = tinker.ServiceClient(base_url=base_url, api_key=key)
training = service.create_lora_training_client(base_model=model, rank=16, seed=0,
                                               train_unembed=False).result()
params = types.SamplingParams(max_tokens=new, temperature=1.0)
adam = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)
report = []
for step in range(steps):
    batch = rows[step * prompts:(step + 1) * prompts]
    t0 = time.time()
    sampler = training.save_weights_and_get_sampling_client().result()
    encoded = [tokenize(r["question"]) for r in batch]
    futures = [sampler.sample(prompt=types.ModelInput.from_ints(p), num_samples=8, sampling_params=params)
               for p in encoded]
    results = [f.result() for f in futures]
    t1 = time.time()
    datums = []
    for prompt, r, res in zip(encoded, batch, results):
        want = r["answer"].split("####")[-1].strip().replace(",", "")
        rewards = []
        for s in res.sequences:
            body = json.dumps({"tokens": s.tokens}).encode()
            req = urllib.request.Request(base_url + "/detokenize", data=body, method="POST",
                                         headers={"content-type": "application/json",
                                                  "authorization": f"Bearer {key}"})
            text = json.load(urllib.request.urlopen(req))["prompt"]
            rewards.append(float(want in re.findall(r"-?\d+", text.replace(",", ""))))
        mean = sum(rewards) / len(rewards)
        for s, rw in zip(res.sequences, rewards):
            tokens = prompt + s.tokens
            n = len(prompt) - 1
            datums.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:],
                                "logprobs": [0.0] * n + list(s.logprobs),
                                "advantages": [0.0] * n + [rw - mean] * len(s.tokens)}))
    t2 = time.time()
    training.forward_backward(datums, "importance_sampling").result()
    training.optim_step(adam).result()
    t3 = time.time()
    report.append({"step_s": round(t3 - t0, 2), "sample_s": round(t1 - t0, 2),
                   "rewards_s": round(t2 - t1, 2), "update_s": round(t3 - t2, 2),
                   "tokens": sum(len(s.tokens) for res in results for s in res.sequences)})
service.close("success").result()
print(json.dumps({"new_tokens": new, "prompts": prompts, "steps": report}))
