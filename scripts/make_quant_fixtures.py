"""Writes crates/ember-kernels/fixtures/quant_blocks.json: weights and the bytes ggml's reference
quantizers make of them (`quantize_row_q4_1_ref`, `quantize_row_q8_0_ref` and the BF16
conversion, as the `gguf` package on PyPI reimplements them bit for bit), for `ember_kernels::QuantMatrix::quantize`'s test.

    python -m venv venv && venv/bin/pip install gguf numpy
    venv/bin/python scripts/make_quant_fixtures.py
"""

import json
import os

import numpy as np
from gguf import GGMLQuantizationType, quantize

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "ember-kernels", "fixtures")


def weights():
    """Three rows of 96: normal weights, a constant block (d = 0), an outlier, ties at .5."""
    rng = np.random.default_rng(0)
    w = rng.normal(0.0, 0.05, size=(3, 96)).astype(np.float32)
    w[1, 32:64] = 0.25
    w[2, 5] = 3.0
    w[2, 64:96] = np.arange(32, dtype=np.float32) * 0.5 - 8.0
    return w


def main():
    w = weights()
    out = {"rows": 3, "cols": 96, "weights": [float(v) for v in w.reshape(-1)]}
    kinds = [
        ("Q4_1", GGMLQuantizationType.Q4_1),
        ("Q8_0", GGMLQuantizationType.Q8_0),
        ("BF16", GGMLQuantizationType.BF16),
    ]
    for name, t in kinds:
        out[name] = quantize(w, t).tobytes().hex()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "quant_blocks.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
