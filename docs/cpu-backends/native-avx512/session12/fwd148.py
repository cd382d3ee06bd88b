"""forward(n) after 128 tokens, n=1..8 interleaved; medians and bests (ms), ratios to n=1."""
import sys, time, statistics, os
import specdemo
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
backend = os.environ.get("BK", "native-w8a8")
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, backend)
kv = target_kv(loaded)
kv.reset(); kv.forward([i % 1000 + 1 for i in range(128)])
ts = {n: [] for n in (1, 4, 8)}
for _ in range(reps):
    for n in ts:
        t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[n].append(time.perf_counter() - t); kv.rollback(128)
med = {n: statistics.median(v) * 1e3 for n, v in ts.items()}
best = {n: min(v) * 1e3 for n, v in ts.items()}
print(backend, "omp", getattr(specdemo, "OMP_WAIT", None))
print("median", " ".join(f"{n}:{med[n]:.2f}" for n in ts))
print("ratio ", " ".join(f"{n}:{med[n]/med[1]:.2f}" for n in ts))
print("best  ", " ".join(f"{n}:{best[n]:.2f}" for n in ts))
print("bratio", " ".join(f"{n}:{best[n]/best[1]:.2f}" for n in ts))
