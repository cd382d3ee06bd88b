import sys, time, statistics, os
from pathlib import Path
import specdemo.models.native_backend as nb
if os.environ.get("SRC"): nb.SOURCE = Path(os.environ["SRC"])
from specdemo.models.loading import load_model
from specdemo.models.ggml_backend import with_backend, target_kv
reps = int(sys.argv[1]); ctx = int(os.environ.get("CTX", 128))
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
loaded, _ = with_backend(loaded, "native-w8a8")
kv = target_kv(loaded)
kv.reset(); kv.forward([i % 1000 + 1 for i in range(ctx)])
ns = [1, 2, 3, 4, 5, 6, 8]
ts = {n: [] for n in ns}
for _ in range(reps):
    for n in ns:
        t = time.perf_counter(); kv.forward([1] * n, logits_to_keep=n); ts[n].append(time.perf_counter() - t); kv.rollback(ctx)
med = {n: statistics.median(ts[n]) * 1e3 for n in ns}
print(os.environ.get("SRC", "new"), ctx, "ms", " ".join(f"{med[n]:.2f}" for n in med), "| ratio", " ".join(f"{med[n]/med[1]:.2f}" for n in med), flush=True)
