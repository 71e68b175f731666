"""The `tinker` SDK (0.38.0) against `ember serve --tinker`, as a user's loop would call it.

Usage: python tinker_client.py BASE_URL MODEL_NAME OUT_JSON

Prints nothing on success; writes what it saw to OUT_JSON for tests/tinker.rs to check against
Ember's own numbers. Every call is the SDK's public API, unchanged.
"""

import json
import sys

import numpy as np
import tinker
from tinker import types

base_url, model_name, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}

service = tinker.ServiceClient(base_url=base_url, api_key="tml-ember-test")
caps = tinker.RestClient(base_url=base_url, api_key="tml-ember-test").get_server_capabilities().result()
out["models"] = [m.model_name for m in caps.supported_models]

training = service.create_lora_training_client(base_model=model_name, rank=8, seed=3).result()
# The same model under its alias (--alias), and a name the server does not serve.
alias = service.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=4,
                                            train_unembed=False).result()
out["alias_model"] = alias.get_info().model_data.model_name
try:
    service.create_lora_training_client(base_model="nobody/nothing", rank=4).result()
    out["unknown_model"] = ""
except Exception as e:
    out["unknown_model"] = str(e)
out["info_model"] = training.get_info().model_data.model_name

# Two datums of different lengths: tokens x, targets y (position i predicts y[i]), weights w
# (the second datum's negative: forward_backward_custom sends such weights).
x1, y1, w1 = [1, 504, 3120, 28, 253], [504, 3120, 28, 253, 2], [0.0, 1.0, 1.0, 1.0, 1.0]
x2, y2, w2 = [1, 19, 4437], [19, 4437, 30], [1.0, -0.5, 2.0]
out["datums"] = [[x1, y1, w1], [x2, y2, w2]]


def sft(x, y, w):
    return types.Datum(
        model_input=types.ModelInput.from_ints(x),
        loss_fn_inputs={"target_tokens": np.array(y, dtype=np.int64), "weights": np.array(w, dtype=np.float32)},
    )


data = [sft(*d) for d in out["datums"]]
fwd = training.forward(data, "cross_entropy").result()
out["forward_logprobs"] = [o["logprobs"].tolist() for o in fwd.loss_fn_outputs]
out["forward_loss"] = fwd.metrics["loss:sum"]

# Four steps of SFT at lr 1e-3 on the datums with positive weights: the loss falls. The
# log-probs after the first step are checked against Ember's own update.
sft_data = [sft(x1, y1, w1), sft(x2, y2, [1.0, 1.0, 1.0])]
adam = types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
losses = []
for step in range(4):
    fb = training.forward_backward(sft_data, "cross_entropy").result()
    losses.append(fb.metrics["loss:sum"])
    training.optim_step(adam).result()
    if step == 0:
        one = training.forward(sft_data, "cross_entropy").result()
        out["after_one_step"] = [o["logprobs"].tolist() for o in one.loss_fn_outputs]
after = training.forward(sft_data, "cross_entropy").result()
losses.append(after.metrics["loss:sum"])
out["sft_losses"] = losses

# RL losses on the first datum, with sampler log-probs q that differ from the current ones by
# known amounts (ratios e^0.1, e^0.02, e^-0.2, e^0.3, e^-0.4; PPO clips the third and fourth)
# and the advantages A.
now = training.forward([sft_data[0]], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
q = [v - d for v, d in zip(now, [0.1, 0.02, -0.2, 0.3, -0.4])]
out["rl_q"] = q
rl = types.Datum(
    model_input=types.ModelInput.from_ints(x1),
    loss_fn_inputs={
        "target_tokens": np.array(y1, dtype=np.int64),
        "logprobs": np.array(q, dtype=np.float32),
        "advantages": np.array([0.0, 1.0, -1.0, 2.0, 0.5], dtype=np.float32),
    },
)
out["rl"] = {}
for name, cfg in [("importance_sampling", None), ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
                  ("cispo", None), ("dro", {"beta": 0.5}),
                  ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})]:
    r = training.forward([rl], name, loss_fn_config=cfg).result()
    out["rl"][name] = {"loss": r.metrics["loss:sum"], "logprobs": r.loss_fn_outputs[0]["logprobs"].tolist()}
try:
    training.forward([rl], "stable_reinforce").result()
    out["refused"] = None
except Exception as e:  # the server refuses it by name
    out["refused"] = str(e)

# A batch bigger than the server's chunk (the SDK splits it; chunk 1 is sent last).
many = [sft(x1, y1, w1) for _ in range(5)]
chunked = training.forward(many, "cross_entropy").result()
out["chunked"] = [o["logprobs"].tolist() for o in chunked.loss_fn_outputs]

# Two samples of one prompt in one request (the prompt scored once, shared) against each alone.
seq_a, seq_b = [1, 504, 3120, 28, 253, 2], [1, 504, 3120, 28, 19, 4437]
pair = [sft(s[:-1], s[1:], [1.0] * (len(s) - 1)) for s in (seq_a, seq_b)]
together = training.forward(pair, "cross_entropy").result()
out["shared_together"] = [o["logprobs"].tolist() for o in together.loss_fn_outputs]
out["shared_alone"] = [training.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
                       for d in pair]

# Sampling from the trained weights, twice with one seed, once with another.
sampler = training.save_weights_and_get_sampling_client().result()
prompt = types.ModelInput.from_ints([1, 504, 3120])
params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
a = sampler.sample(prompt=prompt, num_samples=2, sampling_params=params).result()
b = sampler.sample(prompt=prompt, num_samples=2, sampling_params=params).result()
out["samples"] = [[s.tokens, s.logprobs, s.stop_reason] for s in a.sequences]
out["same_seed_same_tokens"] = [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
out["prompt_logprobs"] = sampler.compute_logprobs(types.ModelInput.from_ints(x1)).result()

# Save the state (adapter + AdamW), train one more step, and resume from the save: the resumed
# client's next step equals the first client's.
saved = training.save_state("ckpt-1").result().path
out["saved_path"] = saved
named = training.save_weights_for_sampler("sampler-1").result().path
out["sampler_path"] = named
rest = tinker.RestClient(base_url=base_url, api_key="tml-ember-test")
listed = rest.list_checkpoints(saved.split("/")[2]).result()
out["checkpoints"] = sorted(c.checkpoint_id for c in listed.checkpoints)
info = rest.get_weights_info_by_tinker_path(saved).result()
out["weights_info"] = [info.base_model, info.lora_rank, info.train_attn, info.train_mlp]


def one_step(client):
    client.forward_backward(sft_data, "cross_entropy").result()
    client.optim_step(adam).result()
    return [o["logprobs"].tolist() for o in client.forward(sft_data, "cross_entropy").result().loss_fn_outputs]


out["step_after_save"] = one_step(training)
resumed = service.create_training_client_from_state_with_optimizer(saved).result()
out["step_after_resume"] = one_step(resumed)

# A sampling client over the named sampler save.
from_path = service.create_sampling_client(model_path=named).result()
c = from_path.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
out["from_path_tokens"] = c.sequences[0].tokens

with open(out_path, "w") as f:
    json.dump(out, f)

# Closing the session frees its training clients on the server.
service.close("success").result()
