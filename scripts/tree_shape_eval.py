"""Mean acceptance length per target step from tree_rank_sim.py's ranks: chain k and static trees.
A tree is a set of rank tuples (r1..rd); a round accepts the longest prefix of the true ranks
that is a node. Trees are built greedily (Sequoia/Medusa): add the most frequent rank-prefix
among the calibration anchors until the node budget is used.
    python scripts/tree_shape_eval.py docs/results/tree-ranks.json.gz   (or tree_rank_sim.py's OUT.json)
"""
import gzip, json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo
from specdemo.core.tree import build_shape
from collections import Counter
res = json.load((gzip.open if sys.argv[1].endswith(".gz") else open)(sys.argv[1], "rt"))

def accept(rk, tree):
    n = 0
    for j in range(len(rk)):
        if tuple(rk[:j + 1]) in tree:
            n = j + 1
        else:
            break
    return n

def mal(seqs, tree):
    toks = steps = 0
    for s in seqs:
        L = s["prompt_len"] + 1
        while str(L) in s["ranks"] and L < s["n"]:
            a = accept(s["ranks"][str(L)], tree)
            a = min(a, s["n"] - L - 1) if s["n"] - L - 1 >= 0 else 0
            toks += a + 1; steps += 1; L += a + 1
    return toks / max(steps, 1)

def build(seqs_list, budget, depth=4, maxrank=8):
    c = Counter()
    for seqs in seqs_list:
        for s in seqs:
            for rk in s["ranks"].values():
                for j in range(min(len(rk), depth)):
                    if rk[j] >= maxrank: break
                    c[tuple(rk[:j + 1])] += 1
    return set(build_shape(dict(c), budget).paths)  # the product's own greedy choice

chain = lambda k: {tuple([0] * j) for j in range(1, k + 1)}
tasks = list(res)
calib_all = [res[t]["calib"] for t in tasks if "calib" in res[t]]
print("task   chain4 chain5 | tree4 tree8 tree12 tree16 tree24 (depth 4, calib all tasks) | tree16 own task")
for t in tasks:
    if "eval" not in res[t]:
        continue
    ev = res[t]["eval"]
    row = [mal(ev, chain(4)), mal(ev, chain(5))]
    row += [mal(ev, build(calib_all, b)) for b in (4, 8, 12, 16, 24)]
    row += [mal(ev, build([res[t]["calib"]], 16))] if "calib" in res[t] else []
    print(t.ljust(8), " ".join(f"{x:.2f}" for x in row))
for b in (8, 12, 16):
    tr = build(calib_all, b)
    print(b, sorted(tr, key=lambda x: (len(x), x)))
