"""A/B within one process: forward(n) after 128 tokens, configs alternated every repeat."""
import sys, time, statistics, os
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pcts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "100,75").split(",")]
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, os.environ.get("BK", "native-w8a8"))
kv = target_kv(loaded)
lib = kv.nmodel.lib
kv.reset(); kv.forward([i % 1000 + 1 for i in range(128)])
ts = {(p, n): [] for p in pcts for n in range(1, 9)}
for _ in range(reps):
    for n in range(1, 9):
        for p in pcts:
            lib.nf_set_split_pct(p)
            t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[(p, n)].append(time.perf_counter() - t); kv.rollback(128)
for p in pcts:
    med = {n: statistics.median(ts[(p, n)]) * 1e3 for n in range(1, 9)}
    print(f"pct={p:3d} median", " ".join(f"{n}:{med[n]:.2f}" for n in med), "| ratio", " ".join(f"{med[n]/med[1]:.2f}" for n in med))
