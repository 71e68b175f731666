"""The PyPI `openai` client, unmodified, against `ember serve` (run by tests/serve.rs).

Usage: EMBER_API_KEY=KEY python tests/serve_openai_client.py BASE_URL MODEL ADAPTER_DIR
(the server started with the same key, and with its admin routes on for ADAPTER_DIR). Prints one JSON line of findings; exits non-zero (with the failed check) when a check fails.
"""

import concurrent.futures
import json
import os
import sys
import urllib.error
import urllib.request

import openai

base_url, model, adapter_dir = sys.argv[1], sys.argv[2], sys.argv[3]
key = os.environ["EMBER_API_KEY"]
client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
found = {}


class Reply:
    """Status and body of a plain POST (vLLM's adapter endpoints have no client method)."""

    def __init__(self, status_code, text):
        self.status_code, self.text = status_code, text

    def json(self):
        return json.loads(self.text)


def post(path, body, key=key):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base_url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return Reply(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read().decode())


# The model list.
ids = [m.id for m in client.models.list().data]
assert ids == [model], ids

# Chat, greedy, with the sampled tokens' log-probs.
messages = [{"role": "user", "content": "What is 2+3? Answer with the number."}]
chat = client.chat.completions.create(
    model=model, messages=messages, temperature=0, max_tokens=24, logprobs=True
)
c = chat.choices[0]
assert c.message.role == "assistant" and c.message.content, chat
assert c.finish_reason in ("stop", "length"), c.finish_reason
lps = [t.logprob for t in c.logprobs.content]
assert len(lps) == chat.usage.completion_tokens > 0, (len(lps), chat.usage)
assert all(lp <= 0.0 for lp in lps), lps
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
found["chat"] = c.message.content
found["chat_logprob_sum"] = sum(lps)

# Completion, greedy: the model continues a count.
comp = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=6, temperature=0,
                                 logprobs=1)
text = comp.choices[0].text
assert text.startswith(" 4"), text
assert len(comp.choices[0].logprobs.token_logprobs) == comp.usage.completion_tokens
found["completion"] = text

# Streaming (Server-Sent Events) read by the unmodified client: several deltas whose text is
# the non-streamed answer's, the finish reason last, and the usage event with
# `stream_options.include_usage`.
def streamed(create, **kw):
    parts, finish, usage, roles = {}, {}, None, set()
    for ch in create(stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            assert ch.choices == [], ch
            usage = ch.usage
        for x in ch.choices:
            piece = x.delta.content if hasattr(x, "delta") else x.text
            if getattr(x, "delta", None) is not None and x.delta.role:
                roles.add(x.delta.role)
            if piece:
                parts.setdefault(x.index, []).append(piece)
            if x.finish_reason:
                assert x.index not in finish, "two finish reasons"
                finish[x.index] = x.finish_reason
    return parts, finish, usage, roles

parts, finish, usage, roles = streamed(client.chat.completions.create, model=model,
                                       messages=messages, temperature=0, max_tokens=24)
assert "".join(parts[0]) == c.message.content and len(parts[0]) >= 3, parts
assert finish == {0: c.finish_reason} and roles == {"assistant"}, (finish, roles)
assert usage.completion_tokens == chat.usage.completion_tokens, usage
parts, finish, usage, _ = streamed(client.completions.create, model=model, prompt="1, 2, 3,",
                                   max_tokens=12, temperature=0, stop=[", 6"], n=2)
cut = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=12, temperature=0,
                                stop=[", 6"])
for i in (0, 1):
    assert "".join(parts[i]) == cut.choices[0].text and ", 6" not in "".join(parts[i]), parts
assert finish == {0: "stop", 1: "stop"} and usage.completion_tokens > 0, (finish, usage)
found["stream_deltas"] = len(parts[0])

# echo, as lm-eval-harness's `local-completions` asks for a log-likelihood: token-id prompts
# (context + continuation), max_tokens 1, temperature 0, logprobs 1; it sums
# token_logprobs[ctxlen:-1] and calls the continuation greedy when each of its log-probs is the
# top-1 alternative's.
ctx = comp.usage.prompt_tokens
ids_req = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True})
prompt_ids = ids_req.choices[0].model_extra["prompt_token_ids"]
gen_ids = ids_req.choices[0].model_extra["token_ids"]
assert len(prompt_ids) == ctx, (prompt_ids, ctx)
full = prompt_ids + gen_ids[:2]
echo = client.completions.create(model=model, prompt=[full], max_tokens=1, temperature=0,
                                 logprobs=1, echo=True)
lp = echo.choices[0].logprobs
assert len(lp.token_logprobs) == len(full) + 1 and lp.token_logprobs[0] is None, lp
assert lp.top_logprobs[0] is None and len(lp.top_logprobs) == len(full) + 1
cont = lp.token_logprobs[ctx:-1]
tops = lp.top_logprobs[ctx:-1]
assert len(cont) == 2
# The greedy continuation is greedy, and its log-probs are the generation's (same model).
assert all(abs(t - max(top.values())) < 1e-5 for t, top in zip(cont, tops)), (cont, tops)
for a, b in zip(cont, comp.choices[0].logprobs.token_logprobs[:2]):
    assert abs(a - b) < 1e-3, (cont, comp.choices[0].logprobs.token_logprobs)
# Scoring only (max_tokens 0): the same prompt log-probs.
only = client.completions.create(model=model, prompt=[full], max_tokens=0, logprobs=1, echo=True)
assert only.usage.completion_tokens == 0
assert all(abs(a - b) < 1e-5 for a, b in zip(only.choices[0].logprobs.token_logprobs[1:],
                                               lp.token_logprobs[1:len(full)]))
# A continuation the model would not choose is not greedy.
worse = prompt_ids + [gen_ids[0] + 1]
w = client.completions.create(model=model, prompt=[worse], max_tokens=0, logprobs=1, echo=True)
wl = w.choices[0].logprobs
assert wl.token_logprobs[-1] < max(wl.top_logprobs[-1].values()), wl
found["echo_continuation_logprob"] = sum(cont)

# n > 1 with a seed: n choices, and the same seed gives the same choices.
def sample(seed):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12,
                                  temperature=1.0, n=3, seed=seed)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    return [ch.text for ch in r.choices]

a, b = sample(7), sample(7)
assert a == b, (a, b)
assert len(set(a)) > 1, a
found["n3_distinct"] = len(set(a))

# Stop strings are cut from the text.
r = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=12, temperature=0,
                              stop=[", 6"])
assert r.choices[0].finish_reason == "stop" and ", 6" not in r.choices[0].text, r.choices[0]

# The key: none or a wrong one is 401, for the client and for the admin routes.
wrong = openai.OpenAI(base_url=base_url + "/v1", api_key="wrong", max_retries=0)
try:
    wrong.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e
for k in (None, "wrong"):
    h = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": adapter_dir}, key=k)
    assert h.status_code == 401, h.text
# A path outside the allowed directories is 403.
h = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/"})
assert h.status_code == 403 and "outside the allowed" in h.text, h.text

# A LoRA adapter loaded at run time (vLLM's endpoint) is listed, selected by name, and changes
# the greedy answer; unloaded, it is gone.
h = post("/v1/load_lora_adapter", {"lora_name": "tuned", "lora_path": adapter_dir})
assert h.status_code == 200, h.text
assert [m.id for m in client.models.list().data] == [model, "tuned"]
tuned = client.chat.completions.create(model="tuned", messages=messages, temperature=0,
                                       max_tokens=24)
assert tuned.choices[0].message.content != c.message.content, tuned
found["tuned"] = tuned.choices[0].message.content
h = post("/v1/load_lora_adapter", {"lora_name": "tuned", "lora_path": adapter_dir})
assert h.status_code == 400 and "already been loaded" in h.json()["error"]["message"], h.text
h = post("/v1/unload_lora_adapter", {"lora_name": "tuned"})
assert h.status_code == 200, h.text
h = post("/v1/unload_lora_adapter", {"lora_name": "tuned"})
assert h.status_code == 404, h.text

# Errors: the client raises the right class, with the server's JSON message.
def error_of(f):
    try:
        f()
    except openai.APIStatusError as e:
        return e.status_code, e.body
    raise AssertionError("no error")

status, body = error_of(lambda: client.chat.completions.create(
    model="tuned", messages=messages, max_tokens=4))
assert status == 404 and "does not exist" in body["message"], (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x", max_tokens=4, temperature=101))
assert status == 400 and body["param"] == "temperature", (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x", max_tokens=100000))
assert status == 400 and body["param"] == "max_tokens", (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x", max_tokens=2000, n=48))
assert status == 400 and "--max-batch-tokens" in body["message"], (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x", max_tokens=4, n=49))
assert status == 400 and "--max-batch" in body["message"], (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt=[], max_tokens=4))
assert status == 400, (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt=[[5, 10**7]], max_tokens=4))
assert status == 400 and "vocabulary" in body["message"], (status, body)
status, body = error_of(lambda: client.chat.completions.create(
    model=model, messages=[{"role": "wizard", "content": "hi"}], max_tokens=4))
assert status == 400 and "role" in body["message"], (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x", max_tokens=4, stream=True, logprobs=1))
assert status == 400 and body["param"] == "logprobs", (status, body)
status, body = error_of(lambda: client.completions.create(
    model=model, prompt="x " * 3_000_000, max_tokens=4))
assert status == 413, (status, body)
h = post("/v1/chat/completions", b"{not json")
assert h.status_code == 400 and "error" in h.json(), h.text
found["errors"] = "ok"

# Concurrent requests are all answered (and batched together by the engine).
def one(i):
    r = client.completions.create(model=model, prompt=f"{i} + {i} =", max_tokens=8,
                                  temperature=0)
    return r.choices[0].text

with concurrent.futures.ThreadPoolExecutor(12) as pool:
    answers = list(pool.map(one, range(12)))
assert len(answers) == 12 and all(isinstance(t, str) and t for t in answers), answers
# Greedy answers do not depend on what they were batched with.
assert answers[3] == one(3), (answers[3], one(3))
found["concurrent"] = len(answers)
print(json.dumps(found))
