"""Per-step cost of EAGLE-3 heads on this machine (run it quiet): one head step at context 200
with float32 and bfloat16 weights, alone and with the expansion to the target vocabulary.

    python scripts/head_step_cost.py builtin:smollm2-135m-eagle3 [OTHER_HEAD_DIR ...]
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

import sys, time, torch
from specdemo.models.loading import load_model
from specdemo.models.learned import load_learned
from specdemo.core.drafters.vocab import expand_logits
torch.set_grad_enabled(False)
t = load_model("builtin:smollm2-135m", "cpu", "float32")
for spec in sys.argv[1:]:
    for dtype in (torch.float32, torch.bfloat16):
        head = load_learned(spec, t, dtype=dtype).head
        head.attach(t.model.get_input_embeddings())
        H = head.config.hidden_size
        out, logits, past = head.step(head.project(torch.randn(1, 200, 3 * H)), torch.randint(0, 1000, (1, 200)), torch.arange(200)[None], None)
        h, did = out[:, -1:], head.draft_ids()
        def one():
            return head.step(h, torch.tensor([[5]]), torch.tensor([[200]]), past)[1]
        def full():
            return expand_logits(one()[0, -1].float(), did, 49152).argmax(-1)
        for f, name in [(one, "head.step"), (full, "step+expand+argmax")]:
            for _ in range(5): f()
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(40): f()
                ts.append((time.perf_counter() - t0) / 40 * 1000)
            print(spec.split("/")[-1], str(dtype)[6:], name, f"median {sorted(ts)[2]:.2f} ms", flush=True)
