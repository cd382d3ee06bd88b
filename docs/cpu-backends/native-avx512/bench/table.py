import json, glob, os, sys
O = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tasks = ["chat", "code", "maths", "creative", "grounded"]
print("| backend | drafter | k | " + " | ".join(tasks) + " |")
print("|---|---|---|" + "---|" * len(tasks))
plain = {}
for d in sorted(f for f in glob.glob(O + "/*/bench.json") if "/server-" not in f):
    j = json.load(open(d))
    be = j["machine"]["backend"]; dr = j["draft"]
    for k in (4, "auto"):
        cells = {c["task"]: c for c in j["cells"] if c["draft_length"] == k}
        row = []
        for t in tasks:
            c = cells.get(t)
            if not c: row.append("-"); continue
            plain.setdefault(be, []).append(c["plain_tokens_per_s"])
            row.append(f"{c['tokens_per_s']:.1f} ({c['speedup']:.2f}x; L {c['mean_acceptance_length']:.2f}){'' if c['identical'] else ' NOT IDENTICAL'}")
        print(f"| {be} | {dr} | {k} | " + " | ".join(row) + " |")
for be, v in plain.items():
    print(be, "plain", f"{min(v):.1f}-{max(v):.1f}")
for t in tasks:
    f = f"{O}/server-ngram-mod-{t}/bench.json"
    if os.path.exists(f):
        j = json.load(open(f))
        for c in j["cells"]:
            print("server", t, c.get("engine"), round(c.get("plain_tokens_per_s") or 0, 1), round(c.get("tokens_per_s") or 0, 1), c.get("speedup"))
