"""PyTorch's f32 matrix product (MKL on x86, 2 threads) on the shapes `benches/cpu_peak` takes,
for a side-by-side reading of the gemm crate's rate:

    python benches/torch_mm.py 1024,576,1536 576,1024,1536,tA 1024,1536,576,tB

`M,K,N` is `[M, K] · [K, N]`; `tA` / `tB` store that operand transposed (a backward pass's
`xᵀ · dy` and `dy · Wᵀ`). Best of up to 200 runs, in GFLOP/s.
"""

import sys
import time

import torch


def rate(m: int, k: int, n: int, ta: bool, tb: bool) -> float:
    a = torch.rand(k, m).t() if ta else torch.rand(m, k)
    b = torch.rand(n, k).t() if tb else torch.rand(k, n)
    c = torch.empty(m, n)
    best = float("inf")
    for _ in range(max(3, min(200, int(2e11 / (2 * m * n * k))))):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t)
    return 2 * m * n * k / best / 1e9


def main() -> None:
    torch.set_num_threads(2)
    for arg in sys.argv[1:]:
        parts = arg.split(",")
        m, k, n = (int(x) for x in parts[:3])
        ta, tb = "tA" in parts, "tB" in parts
        label = f"{m:5} x {k:4} x {n:5}{' Aᵀ' if ta else ''}{' Bᵀ' if tb else ''}"
        print(f"  {label}: {rate(m, k, n, ta, tb):6.1f} GFLOP/s (torch.mm)")


if __name__ == "__main__":
    main()
