"""Hostile JSON bodies against a running `ember serve`, classified (loopback only).

    ember serve --model <model> --served-model-name m --port 8311 --enable-admin \
        --allowed-path /tmp/allowed &
    python3 scripts/fuzz_serve.py --port 8311 --model m --out /tmp/fuzz-serve.json

For each route (`/v1/completions`, `/v1/chat/completions`, the adapter and weight routes, the
tokenizer routes) it
takes a valid body and replaces each field in turn with hostile values (wrong types, negative,
zero, huge, NaN-like strings, deep nesting, token ids past the vocabulary, enormous counts),
plus malformed bodies (not JSON, a JSON array, truncated, a wrong content type). Each try is
`clean` (a 4xx answer with OpenAI's `{"error": ...}` body), `ok` (200), `server_error` (5xx),
`no_answer` (reset, timeout, or a body that is not JSON) or `dead` (the server stopped
answering `/health` afterwards). Prints the counts and writes every try to --out.
"""

import argparse
import http.client
import json

import fuzz_common

HOSTILE = [None, True, "x", -1, 0, 10**20, 1e308, -1e308, [], {}, [[[[[[1]]]]]], "NaN",
           [10**12], [-5], "a" * 100000]


def request(port, method, path, body, ctype="application/json", timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        c.request(method, path, body=data, headers={"content-type": ctype})
        r = c.getresponse()
        return r.status, r.read()
    except Exception as e:  # noqa: BLE001 (every failure is an outcome here)
        return 0, str(e).encode()
    finally:
        c.close()


def classify(status, raw):
    if status == 0:
        return "no_answer"
    if status == 200:
        return "ok"
    if status >= 500:
        return "server_error"
    try:
        v = json.loads(raw)
    except ValueError:
        return "no_answer"
    return "clean" if isinstance(v, dict) and "error" in v else "no_answer"


def bodies(model):
    comp = {"model": model, "prompt": "Hello", "max_tokens": 4, "n": 1, "temperature": 0,
            "logprobs": 1, "seed": 1, "stop": ["\n"], "top_p": 1.0, "echo": False}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0, "n": 1, "stream": False}
    lora = {"lora_name": "a", "lora_path": "/nonexistent"}
    weights = {"model_path": "/nonexistent"}
    tokenize = {"prompt": "Hello", "add_special_tokens": True, "return_token_strs": True}
    chat_tokens = {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True,
                   "chat_template_kwargs": {"enable_thinking": False}}
    detokenize = {"tokens": [1, 2, 3]}
    return [("/v1/completions", comp), ("/v1/chat/completions", chat),
            ("/v1/load_lora_adapter", lora), ("/update_weights_from_disk", weights),
            ("/tokenize", tokenize), ("/tokenize", chat_tokens), ("/detokenize", detokenize)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tries = []

    def attempt(path, body, what, ctype="application/json"):
        status, raw = request(a.port, "POST", path, body, ctype)
        kind = classify(status, raw)
        if request(a.port, "GET", "/health", None)[0] != 200:
            kind = "dead"
        tries.append({"path": path, "what": what, "status": status, "outcome": kind,
                      "answer": raw[:200].decode("utf-8", "replace")})
        print(f"{kind:12} {status} {path} {what[:80]}", flush=True)
        return kind

    for path, valid in bodies(a.model):
        for field in list(valid):
            for h in HOSTILE:
                body = dict(valid)
                body[field] = h
                attempt(path, body, f"{field}={json.dumps(h)[:40]}")
            body = {k: v for k, v in valid.items() if k != field}
            attempt(path, body, f"without {field}")
        for raw, what, ctype in [("{", "truncated", "application/json"),
                                 ("[1, 2]", "an array", "application/json"),
                                 ("not json", "not JSON", "application/json"),
                                 (json.dumps(valid), "text/plain", "text/plain"),
                                 ("{" * 10000 + "}" * 10000, "deep nesting", "application/json")]:
            attempt(path, raw, what, ctype)
    fuzz_common.write_counts(a.out, tries)


if __name__ == "__main__":
    main()
