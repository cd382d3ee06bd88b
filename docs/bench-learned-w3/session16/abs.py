import csv, sys, glob, os, statistics
d = sys.argv[1]
tasks = ["code", "maths", "grounded", "chat", "creative"]
data = {}
for f in sorted(glob.glob(f"{d}/*/bench.csv")):
    run = os.path.basename(os.path.dirname(f)); r_, ver, draft = run.split("-", 2)
    for r in csv.DictReader(open(f)):
        data.setdefault((draft, ver), {}).setdefault(r["task"], []).append((float(r["plain_tokens_per_s"]), float(r["tokens_per_s"]), float(r["speedup"])))
print("| drafter | engine | " + " | ".join(tasks) + " | plain tok/s (median of all cells) |")
print("|---|---|" + "---|" * (len(tasks) + 1))
for (draft, ver), t in sorted(data.items()):
    plains = [x[0] for v in t.values() for x in v]
    print(f"| {draft} | {ver} | " + " | ".join(
        "/".join(f"{x[1]:.0f} ({x[2]:.2f}x)" for x in t[k]) for k in tasks) + f" | {statistics.median(plains):.0f} |")
