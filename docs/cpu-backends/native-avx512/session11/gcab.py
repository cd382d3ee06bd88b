"""A/B in one process: forward(1) and forward(5) after 128 tokens with and without gc.freeze(),
blocks of 200 forwards alternated; medians (ms)."""
import gc, sys, time, statistics, os
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 6
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, os.environ.get("BK", "native-w8a8"))
kv = target_kv(loaded)
kv.reset(); kv.forward([i % 1000 + 1 for i in range(128)])
print("tracked objects", len(gc.get_objects()))
ts = {(f, n): [] for f in (0, 1) for n in (1, 5)}
for b in range(blocks):
    for f in (0, 1):
        (gc.freeze if f else gc.unfreeze)()
        for _ in range(200):
            for n in (1, 5):
                t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[(f, n)].append(time.perf_counter() - t); kv.rollback(128)
for (f, n), v in ts.items():
    print(f"freeze={f} n={n} median {statistics.median(v)*1e3:.3f} mean {statistics.fmean(v)*1e3:.3f} p99 {sorted(v)[int(.99*len(v))]*1e3:.2f} ms")
