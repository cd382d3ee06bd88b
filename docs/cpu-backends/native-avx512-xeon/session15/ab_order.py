"""A/B within one process: forward(n) after CTX tokens, prefetch (min:dist:hint) alternated every repeat."""
import sys, time, statistics, os, random
random.seed(1)
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
reps = int(sys.argv[1]); cfgs = [tuple(int(v) for v in c.split(":")) for c in sys.argv[2].split(",")]
ctx = int(os.environ.get("CTX", 128))
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, "native-w8a8")
kv = target_kv(loaded); lib = kv.nmodel.lib
kv.reset(); kv.forward([i % 1000 + 1 for i in range(ctx)])
ns = [1, 2, 3, 4, 5, 6, 8]
ts = {(c, n): [] for c in cfgs for n in ns}
for _ in range(reps):
    for n in ns:
        for c in random.sample(cfgs, len(cfgs)):
            lib.nf_set_prefetch(c[0], c[1]); lib.nf_set_q_order(c[2])
            t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[(c, n)].append(time.perf_counter() - t); kv.rollback(ctx)
for c in cfgs:
    med = {n: statistics.median(ts[(c, n)]) * 1e3 for n in ns}
    print(f"min={c[0]} dist={c[1]:5d} order={c[2]}", " ".join(f"{n}:{med[n]:.2f}" for n in med), "| ratio", " ".join(f"{med[n]/med[1]:.2f}" for n in med), flush=True)
