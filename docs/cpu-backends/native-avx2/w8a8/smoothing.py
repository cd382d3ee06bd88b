"""Experiment of wave 3 session 9 (docs/cpu-backends.md, "native-w8a8"): top-1 agreement with
float32 greedy tokens (teacher forced, 10 bench prompts x 48 tokens) when the inputs of the
built-in model's linears are rounded in torch (fake quantisation; weights float32).
    PYTHONPATH=. .venv/bin/python docs/cpu-backends/native-avx2/w8a8/smoothing.py
"""
import torch, sys
from specdemo.models.loading import load_model
from specdemo.services.prompts import load_prompts
from specdemo.services.pipeline import Pipeline
torch.set_num_threads(1)
loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
model = loaded.model
pipe = Pipeline(loaded, "none")
allp = [p for ps in load_prompts().values() for p in ps]
prompts = allp[:10]; calib = allp[10:]
seqs = []
with torch.inference_mode():
    for p in prompts:
        ids = pipe.prompt_ids(p)
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)
        seqs.append((len(ids), out[0]))
lin = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
amax = {}
def rec(name):
    def hook(_m, args):
        a = args[0].abs().reshape(-1, args[0].shape[-1]).amax(0)
        amax[name] = torch.maximum(amax.get(name, a), a)
    return hook
hs = [m.register_forward_pre_hook(rec(n)) for n, m in lin.items()]
with torch.inference_mode():
    for p in calib:
        model(torch.tensor([pipe.prompt_ids(p)]))
for h in hs: h.remove()
def fq(bits, s=None, block=None):
    lim = 2 ** (bits - 1) - 1
    def hook(_m, args):
        x = args[0]
        if s is not None: x = x / s
        shp = x.shape
        if block: x = x.reshape(*shp[:-1], shp[-1] // block, block)
        am = x.abs().amax(-1, keepdim=True).clamp(min=1e-30)
        y = (torch.round(x * (lim / am)).clamp(-lim, lim) * (am / lim)).reshape(shp)
        return (y * s if s is not None else y,)
    return hook
def agreement(alpha, bits=7, block=None):
    hs = []
    for n, m in lin.items():
        s = None
        if alpha is not None:
            wmax = m.weight.abs().amax(0).clamp(min=1e-5)
            s = (amax[n].clamp(min=1e-5) ** alpha / wmax ** (1 - alpha))
        hs.append(m.register_forward_pre_hook(fq(bits, s, block)))
    a = t = 0
    with torch.inference_mode():
        for n0, sq in seqs:
            logits = model(sq[None, :-1]).logits[0, n0 - 1:]
            a += (logits.argmax(-1) == sq[n0:]).sum().item(); t += len(sq) - n0
    for h in hs: h.remove()
    return a / t
for alpha in (None, 0.3, 0.5, 0.7, 0.85):
    print("a7 alpha", alpha, f"{agreement(alpha):.3f}", flush=True)
print("a8 alpha 0.5", f"{agreement(0.5, 8):.3f}")
