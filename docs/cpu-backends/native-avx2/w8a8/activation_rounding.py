"""Experiment of wave 3 session 9 (docs/cpu-backends.md, "native-w8a8"): top-1 agreement with
float32 greedy tokens (teacher forced, 10 bench prompts x 48 tokens) when the inputs of the
built-in model's linears are rounded in torch (fake quantisation; weights float32).
    PYTHONPATH=. .venv/bin/python docs/cpu-backends/native-avx2/w8a8/activation_rounding.py
"""
import torch, sys
from specdemo.models.loading import load_model
from specdemo.services.prompts import load_prompts
from specdemo.services.pipeline import Pipeline
torch.set_num_threads(1)
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
model = loaded.model
tok = loaded.tokenizer
pipe = Pipeline(loaded, "none")
prompts = [p for ps in load_prompts().values() for p in ps][:10]
seqs = []
with torch.inference_mode():
    for p in prompts:
        ids = pipe.prompt_ids(p)
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)
        seqs.append((len(ids), out[0]))
def fq(bits, block=None):
    lim = 2 ** (bits - 1) - 1
    def hook(_m, args):
        x = args[0]
        shp = x.shape
        if block:
            x = x.reshape(*shp[:-1], shp[-1] // block, block)
        amax = x.abs().amax(-1, keepdim=True).clamp(min=1e-30)
        y = torch.round(x * (lim / amax)).clamp(-lim, lim) * (amax / lim)
        return (y.reshape(shp),)
    return hook
def agreement(select, bits, block=None):
    hs = [m.register_forward_pre_hook(fq(bits, block)) for n, m in model.named_modules()
          if isinstance(m, torch.nn.Linear) and select(n)]
    a = t = 0
    with torch.inference_mode():
        for n0, s in seqs:
            logits = model(s[None, :-1]).logits[0, n0 - 1:]
            a += (logits.argmax(-1) == s[n0:]).sum().item(); t += len(s) - n0
    for h in hs: h.remove()
    return a / t
cfgs = [("none", lambda n: False, 7, None), ("all a7", lambda n: True, 7, None),
        ("all a8", lambda n: True, 8, None), ("all a7 block32", lambda n: True, 7, 32),
        ("all a7 block64", lambda n: True, 7, 64),
        ("only down", lambda n: "down" in n, 7, None), ("only o", lambda n: "o_proj" in n, 7, None),
        ("only qkv", lambda n: any(k in n for k in ("q_proj", "k_proj", "v_proj")), 7, None),
        ("only gate_up", lambda n: any(k in n for k in ("gate", "up_proj")), 7, None),
        ("only head", lambda n: "lm_head" in n, 7, None),
        ("all but down a7", lambda n: "down" not in n, 7, None)]
for name, sel, bits, block in cfgs:
    print(f"{name}: {agreement(sel, bits, block):.3f}", flush=True)
