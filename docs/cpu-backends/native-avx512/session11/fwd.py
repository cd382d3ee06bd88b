"""Loop forward(n) after 128 tokens on native-w8a8; print per-n median ms."""
import sys, time, statistics, os
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
n = int(sys.argv[1]); reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
backend = os.environ.get("BK", "native-w8a8")
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, backend)
kv = target_kv(loaded)
kv.reset(); kv.forward([i % 1000 + 1 for i in range(128)])
ts = []
for _ in range(reps):
    t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts.append(time.perf_counter() - t); kv.rollback(128)
ts.sort()
print(f"n={n} median {statistics.median(ts)*1e3:.2f} ms best {ts[0]*1e3:.2f}")
