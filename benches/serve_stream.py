"""Time to first token and whole-answer time of `ember serve`, streamed and not, with the PyPI
`openai` client on the loopback address (one request at a time; bounded in count).

    ember serve --model ~/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf --port 8123 &
    python benches/serve_stream.py --port 8123 --requests 5 --max-tokens 64

Prints the medians: the streamed answer's first content delta, its last, and the non-streamed
answer's arrival.
"""

import argparse
import statistics
import time

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="none")
    model = client.models.list().data[0].id
    first, last, whole, tokens = [], [], [], []
    for i in range(a.requests):
        msgs = [{"role": "user", "content": f"Tell me a story about the number {i}."}]
        kw = dict(model=model, messages=msgs, max_tokens=a.max_tokens, temperature=0)
        t0 = time.perf_counter()
        seen = None
        for ch in client.chat.completions.create(stream=True, **kw):
            if ch.choices and ch.choices[0].delta.content and seen is None:
                seen = time.perf_counter() - t0
        first.append(seen if seen is not None else float("nan"))
        last.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = client.chat.completions.create(**kw)
        whole.append(time.perf_counter() - t0)
        tokens.append(r.usage.completion_tokens)
    med = statistics.median
    print(f"{a.requests} requests, {med(tokens)} tokens (median): streamed first delta "
          f"{med(first):.3f} s, streamed last {med(last):.3f} s; not streamed {med(whole):.3f} s")


if __name__ == "__main__":
    main()
