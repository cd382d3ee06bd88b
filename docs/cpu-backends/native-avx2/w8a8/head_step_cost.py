"""The C EAGLE-3 head step of the shipped head in each weight format (bf16, int8, w8a8): 4 steps
at context 200, 40 interleaved rounds, median and best milliseconds a step (wave 3 session 9).
    PYTHONPATH=. .venv/bin/python docs/cpu-backends/native-avx2/w8a8/head_step_cost.py
"""
import time, torch, statistics
from specdemo.models.loading import load_model
from specdemo.models.learned import load_learned
from specdemo.models import native_backend as nb
torch.set_grad_enabled(False)
t = load_model("builtin:smollm2-135m", "cpu", "float32")
head = load_learned("builtin:smollm2-135m-eagle3", t).head
head.attach(t.model.get_input_embeddings())
H = head.config.hidden_size
x = head.project(torch.randn(1, 200, 3 * H))[0]
ids = torch.randint(0, 1000, (200,)).tolist()
heads = {w: nb.NativeEagleHead(head, weights=w) for w in ("bf16", "int8", "w8a8")}
for w, nh in heads.items():
    nh.step(x, ids, 0, 1)
times = {w: [] for w in heads}
for r in range(40):
    for w, nh in heads.items():
        nh.rollback(200)
        t0 = time.perf_counter()
        for i in range(4):
            nh.step(x[-1:], [5], 200 + i, 1)
        times[w].append((time.perf_counter() - t0) / 4)
for w in heads:
    print(w, f"median {statistics.median(times[w])*1e3:.2f} ms a step, min {min(times[w])*1e3:.2f}", "bytes", sum(v.numel()*v.element_size() for k, v in heads[w].weights.tensors.items()))
