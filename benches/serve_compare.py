"""A load generator for OpenAI-compatible servers on the loopback address: concurrent clients
send streamed completions of mixed lengths; reports throughput and latency. Bounded in count
(--requests) and time (--seconds); the standard library only, so it drives `ember serve` and
llama.cpp's `llama-server` alike.

    python benches/serve_compare.py --port 8123 --clients 8 --requests 48 [--seconds 600]

Request i asks for `max_tokens` = LENGTHS[i % 3] (16, 64, 128) with `ignore_eos` (so every
server draws the same number of tokens), temperature 1, after one of six prompts of 6 to 60
words. Each client sends its share one after another. Prints one JSON object: completed
requests, generated tokens per second over the whole run, requests per second, and the p50 /
p90 of the time to the first token and of the whole answer (seconds).
"""

import argparse
import http.client
import json
import statistics
import threading
import time

LENGTHS = [16, 64, 128]
PROMPTS = [
    "The capital of France is",
    "Write a short story about a robot who learns to paint. Once upon a time,",
    "List the first ten prime numbers and explain why each is prime: 2,",
    "Q: A farmer has 17 sheep and all but 9 run away. How many are left? A:",
    "In a distant galaxy, the crew of the starship Meridian discovered a signal coming from a "
    "planet that had no atmosphere, no water and no light. The captain ordered",
    "Explain, step by step, how a bill becomes a law in a parliamentary democracy, starting "
    "with the drafting of the bill by a minister or a member, its readings, the committee "
    "stage, and the final vote. First,",
]


def one(port, model, i, deadline):
    """Sends request i; returns (ttft, total, tokens) or None past the deadline / on error."""
    if time.time() > deadline:
        return None
    body = {
        "model": model,
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": LENGTHS[i % len(LENGTHS)],
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=max(1.0, deadline - time.time()))
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return None
        first, deltas, usage = None, 0, None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    deltas += 1
                    if first is None:
                        first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        return (first if first is not None else total, total, usage if usage else deltas)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def model_name(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())["data"]
    conn.close()
    return models[0]["id"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    model = model_name(a.port)
    deadline = time.time() + a.seconds
    results, lock = [], threading.Lock()

    def client(c):
        for i in range(c, a.requests, a.clients):
            r = one(a.port, model, i, deadline)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r is not None]
    q = lambda xs, p: statistics.quantiles(xs, n=10)[p - 1] if len(xs) >= 2 else float("nan")
    ttft, total = [r[0] for r in ok], [r[1] for r in ok]
    print(json.dumps({
        "label": a.label,
        "clients": a.clients,
        "requests": a.requests,
        "completed": len(ok),
        "wall_s": round(wall, 2),
        "tokens": sum(r[2] for r in ok),
        "tokens_per_s": round(sum(r[2] for r in ok) / wall, 2),
        "requests_per_s": round(len(ok) / wall, 3),
        "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
        "ttft_p90_s": round(q(ttft, 9), 3) if ttft else None,
        "latency_p50_s": round(statistics.median(total), 3) if total else None,
        "latency_p90_s": round(q(total, 9), 3) if total else None,
    }))


if __name__ == "__main__":
    main()
