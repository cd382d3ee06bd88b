"""A/B within one process: forward(n) after 128 tokens, prefetch configs alternated every repeat."""
import sys, time, statistics, os
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
cfgs = [tuple(int(v) for v in c.split(":")) for c in (sys.argv[2] if len(sys.argv) > 2 else "6:4096,1:4096").split(",")]
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, os.environ.get("BK", "native-w8a8"))
kv = target_kv(loaded)
lib = kv.nmodel.lib
kv.reset(); kv.forward([i % 1000 + 1 for i in range(128)])
ts = {(c, n): [] for c in cfgs for n in range(1, 9)}
for _ in range(reps):
    for n in range(1, 9):
        for c in cfgs:
            lib.nf_set_prefetch(*c)
            t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[(c, n)].append(time.perf_counter() - t); kv.rollback(128)
for c in cfgs:
    med = {n: statistics.median(ts[(c, n)]) * 1e3 for n in range(1, 9)}
    print(f"min={c[0]} dist={c[1]:5d} median", " ".join(f"{n}:{med[n]:.2f}" for n in med), "| ratio", " ".join(f"{med[n]/med[1]:.2f}" for n in med))
