import json, sys
rows=[r for r in json.load(open(sys.argv[1])) if "acc" in r]
bins=[[0,0] for _ in range(10)]
pos=[[0,0] for _ in range(8)]
for r in rows:
    for j,c in enumerate(r["conf"]):
        if j > r["acc"]: break
        b=min(int(c*10),9); bins[b][1]+=1; bins[b][0]+= j<r["acc"]
        pos[j][1]+=1; pos[j][0]+= j<r["acc"]
print("rounds",len(rows))
for i,(a,n) in enumerate(bins): print(f"conf {i/10:.1f}-{(i+1)/10:.1f}: {a}/{n} = {a/max(n,1):.2f}")
print("per position", [f"{a/max(n,1):.2f}({n})" for a,n in pos])
# oracle: simulate trimming with calibrated conf, cost model Xeon ratios
r_=[1,1.06,1.20,1.40,1.37,1.59,1.68,1.91,2.0]; td=0.045
cal=[a/max(n,1) for a,n in bins]
def E(s): 
    t=1;x=1
    for q in s: x*=q; t+=x
    return t
import itertools
for mode in ["k4","k8","conf"]:
    tok=0; cost=0
    for r in rows:
        c=r["conf"]; acc=r["acc"]
        if mode=="k4": m=4; d=4
        elif mode=="k8": m=8; d=8
        else:
            # draft until stop rule (one-step: continue while best future rate > stop rate) -- simple: choose m maximizing E/cost with calibrated, draft j = m+1 tokens (needs to see next)
            qs=[cal[min(int(x*10),9)] for x in c]
            best=max(range(len(c)+1), key=lambda m: E(qs[:m])/(r_[m]+ len(c)*td))
            m=best; d=min(len(c), m+1)
        tok+= min(acc,m)+1; cost+= r_[m]+d*td
    print(mode, "tokens/round", tok/len(rows), "speed vs plain", tok/cost)
