import json
print("| task | llama-server plain tok/s | llama-server ngram-mod tok/s (accepted/drafted) |")
print("|---|---|---|")
for t in ["chat","code","maths","creative","grounded"]:
    d=json.load(open(f"/work/data/bench21/server-ngram-mod-{t}/concurrency.json"))["rows"]
    p=[r for r in d if r["lane"]=="plain"][0]; s=[r for r in d if r["lane"]!="plain"][0]
    print(f"| {t} | {p['total_tokens_per_s']:.1f} | {s['total_tokens_per_s']:.1f} ({s['accepted']}/{s['drafted']}) |")
