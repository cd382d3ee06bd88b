# concatenate genA (chat, 3 answers each) and genB (greedy replay) into one answers file whose
# prompt_index points into the shipped prompt set (assets/train/prompts.jsonl)
import json, sys
key = lambda r: (r["task"], r["prompt"], json.dumps(r.get("messages"), ensure_ascii=False))
shipped = [json.loads(l) for l in open("/work/main/assets/train/prompts.jsonl")]
where = {key(r): i for i, r in enumerate(shipped)}
out = open("/work/data/mix/answers.jsonl", "w")
n = 0
for part, pf in (("genA", "prompts_chat"), ("genB", "prompts_replay")):
    rows = [json.loads(l) for l in open(f"/work/data/{pf}.jsonl")]
    for line in open(f"/work/data/{part}/answers.jsonl"):
        try:
            a = json.loads(line)
        except ValueError:
            continue
        a["prompt_index"] = where[key(rows[a["prompt_index"]])]
        out.write(json.dumps(a) + "\n"); n += 1
print(n, "answers")
