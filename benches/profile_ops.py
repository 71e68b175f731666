"""Share of CPU time per kind of work, from a `perf` profile of one `ember bench-llm` row.

    perf record -F 499 -g -o prefill.data -- ember bench-llm --size smollm2 --reps 2 --only prefill
    perf report -i prefill.data --no-children --sort symbol -g none --stdio > prefill.txt
    python benches/profile_ops.py prefill.txt [decode.txt train.txt ...]

Each symbol of the flat profile is put in one bucket by its name (first match below wins). The
benchmark process also builds and writes its random checkpoint before measuring; those
samples ("setup") are left out of the shares, so each column sums to 100 % of the measured rows.
"""

import re
import sys

BUCKETS = [
    ("setup", r"ElementRandom|Distribution::sampler|RngExt|chacha|TensorData::random|save_hf|write_safetensors|"
              r"build_model|copy_folio_from_iter|safetensors|serde_json|float_random"),
    ("GEMM microkernels", r"gemm_f32::microkernel|gemm_f16::microkernel"),
    ("GEMM packing / dispatch", r"gemm_common|gemm_f32::gemm|gemm::gemm"),
    ("exp / sigmoid (scalar libm)", r"expf|__exp|with_errnof|logf|__log"),
    ("element-wise + reductions (burn-flex)", r"burn_flex::ops::(unary|binary|reduce|activation|comparison|mask|gather)|"
                                              r"burn_flex::zip|macerator|burn_flex::simd"),
    ("layout copies (memmove, strided copy)", r"memmove|memcpy|copy_2d_tiled|copy_inner_contiguous|into_contiguous|"
                                              r"slice_write|cat"),
    ("allocation: zeroing, page faults, malloc", r"clear_page|exc_page_fault|memset|_int_malloc|_int_free|malloc|"
                                                 r"unlink_chunk|free|mmap|munmap|page|folio|memcg|lru|mm_|do_anonymous"),
    ("threads: wake-ups, yields, spins", r"sched|yield|spin|futex|finish_task_switch|rayon|crossbeam|"
                                        r"raw_spin|wake|idle|syscall|softirq|irq"),
    ("autodiff bookkeeping", r"burn_autodiff"),
]


def shares(path):
    counts = {name: 0.0 for name, _ in BUCKETS}
    counts["other"] = 0.0
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"\s*([0-9.]+)%\s+\[[.k]\]\s+(.*)", line)
        if not m:
            continue
        pct, sym = float(m.group(1)), m.group(2)
        for name, pat in BUCKETS:
            if re.search(pat, sym):
                counts[name] += pct
                break
        else:
            counts["other"] += pct
    setup = counts.pop("setup")
    measured = sum(counts.values())
    return {k: 100.0 * v / measured for k, v in counts.items()}, setup


def main():
    files = sys.argv[1:]
    if not files:
        sys.exit(__doc__)
    cols = [shares(f) for f in files]
    names = [f.rsplit("/", 1)[-1].removesuffix(".txt") for f in files]
    print("| kind of work | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---:" for _ in names) + " |")
    for key in list(cols[0][0].keys()):
        print(f"| {key} | " + " | ".join(f"{c[0][key]:.1f} %" for c in cols) + " |")
    print("| (setup samples left out) | " + " | ".join(f"{c[1]:.1f} %" for c in cols) + " |")


if __name__ == "__main__":
    main()
