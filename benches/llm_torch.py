"""PyTorch side of benches/llm.rs: the same checkpoints (written by the Rust bench), shapes and
measurements, in eager mode. Run after the Rust bench with the same --out directory:

    python benches/llm_torch.py --out DIR [--size tiny|smollm2|all] [--device cpu|cuda]
                                [--reps N] [--json FILE] [--dtype float32|bfloat16]
                                [--autocast]

Each row has tokens/s of the best run, the first run's seconds, the best ("warm") seconds and the
process's peak resident memory during the measurement (Linux: the high-water mark is reset
before each one through /proc/self/clear_refs, as the Rust bench does). --autocast keeps f32
weights and runs under torch.autocast(bfloat16), the counterpart of Ember's --precision bf16.
"""

import argparse
import contextlib
import json
import os
import time

import torch
import transformers


def timed(fn, reps, device):
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return first, best


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--matmul", action="store_true")
    ap.add_argument("--autocast", action="store_true")
    a = ap.parse_args()
    amp = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) if a.autocast else contextlib.nullcontext
    sizes = ["tiny", "smollm2"] if a.size == "all" else ([] if a.size == "none" else [a.size])
    rows = []
    dtype = getattr(torch, a.dtype)
    if a.matmul:
        # f32 products, then the decode shape with f16 / bf16 operands (activations cast per call),
        # as in Ember's --matmul rows.
        for m, k, n, dt in [(1024, 576, 1536, None), (1024, 576, 49152, None), (32, 576, 1536, None),
                            (32, 576, 1536, torch.float16), (32, 576, 1536, torch.bfloat16)]:
            x = torch.ones(m, k, device=a.device, dtype=dtype)
            y = torch.ones(k, n, device=a.device, dtype=dt or dtype)
            fn = (lambda: x.to(dt) @ y) if dt else (lambda: x @ y)
            first, best = timed(fn, a.reps, a.device)
            name = f"{m}x{k}x{n}" + (f" {str(dt).removeprefix('torch.').replace('float16', 'f16').replace('bfloat16', 'bf16')}" if dt else "")
            print(f"torch matmul {name}: {2 * m * k * n / best / 1e9:.1f} GFLOP/s (best {best:.4f} s)")
            rows.append({"size": "matmul", "bench": name, "gflops": 2 * m * k * n / best / 1e9, "best_s": best})
    for size in sizes:
        model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(a.out, size), dtype=dtype).to(a.device)
        model.eval()
        vocab = model.config.vocab_size

        def toks(b, t):
            return torch.tensor([[((i * t + j) * 7919 + 13) % vocab for j in range(t)] for i in range(b)], device=a.device)

        def record(name, n, ft):
            first, best = ft
            peak = peak_rss_mib()
            print(f"torch {size:8} {name:18} {n / best:12.1f} tokens/s   (best {best:.4f} s, first {first:.3f} s, peak RSS {peak or 0:.0f} MiB)")
            rows.append({"size": size, "bench": name, "tokens_per_s": n / best, "best_s": best, "first_s": first,
                         "peak_rss_mib": peak, "precision": "bf16-autocast" if a.autocast else a.dtype})
            reset_peak_rss()

        b, t = 8, 128
        ids = toks(b, t)
        reset_peak_rss()
        with torch.no_grad(), amp():
            record("prefill_b8_t128", b * t, timed(lambda: model(ids), a.reps, a.device))
            for batch in (1, 32):
                prompt = torch.tensor([[((i * 31 + j * 17) % vocab) for j in range(16)] for i in range(batch)], device=a.device)
                gen = lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64, min_new_tokens=64,
                                             do_sample=False, pad_token_id=0)
                record(f"decode_b{batch}", batch * 64, timed(gen, min(a.reps, 2), a.device))

        def train():
            with amp():
                logits = model(ids).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            (-lp.sum()).backward()
            model.zero_grad(set_to_none=True)

        model.train()
        record("train_b8_t128", b * t, timed(train, a.reps, a.device))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
