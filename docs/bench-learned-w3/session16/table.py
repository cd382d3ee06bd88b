import csv, sys, glob, os, statistics
d = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{d}/*/bench.csv")):
    run = os.path.basename(os.path.dirname(f))
    for r in csv.DictReader(open(f)):
        if r["draft_length"] != "auto" and len(sys.argv) < 3: continue
        rows.setdefault(run, {})[r["task"]] = r
tasks = ["code", "maths", "grounded", "chat", "creative"]
print("| run | " + " | ".join(tasks) + " |")
for run, t in rows.items():
    print(f"| {run} | " + " | ".join(
        f"{float(t[x]['speedup']):.2f}x ({float(t[x]['mean_acceptance_length'] or 0):.2f}, {float(t[x]['acceptance_rate'] or 0):.2f}) {float(t[x]['plain_tokens_per_s']):.0f}" if x in t else "-" for x in tasks) + " |")
