"""The C EAGLE-3 head step of the shipped head in each weight format of the native backends
(bf16, int8, w8a8): 4 steps at context 200, 40 interleaved rounds, median and best milliseconds a
step, and the bytes of the head's weights in that format. Run it on a quiet machine.

    python scripts/native_head_step_cost.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

import torch  # noqa: E402

from specdemo.models import native as nb  # noqa: E402
from specdemo.models.learned import load_learned  # noqa: E402
from specdemo.models.loading import load_model  # noqa: E402

torch.set_grad_enabled(False)
target = load_model("builtin:smollm2-135m", "cpu", "float32")
head = load_learned("builtin:smollm2-135m-eagle3", target).head
head.attach(target.model.get_input_embeddings())
x = head.project(torch.randn(1, 200, 3 * head.config.hidden_size))[0]  # (200, H)
ids = torch.randint(0, 1000, (200,)).tolist()
heads = {w: nb.NativeEagleHead(head, weights=w) for w in ("bf16", "int8", "w8a8")}
for nh in heads.values():
    nh.step(x, ids, 0, 1)
times: dict[str, list[float]] = {w: [] for w in heads}
for _ in range(40):
    for w, nh in heads.items():
        nh.rollback(200)
        t0 = time.perf_counter()
        for i in range(4):
            nh.step(x[-1:], [5], 200 + i, 1)
        times[w].append((time.perf_counter() - t0) / 4)
for w, nh in heads.items():
    size = sum(v.numel() * v.element_size() for v in nh.weights.tensors.values())
    print(f"{w}: median {statistics.median(times[w]) * 1e3:.2f} ms a step, "
          f"best {min(times[w]) * 1e3:.2f} ms, {size / 1e6:.1f} MB of weights")
