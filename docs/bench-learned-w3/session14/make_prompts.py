# session 14: the two prompt files of gen.sh, from the shipped prompt set's training split
#   prompts_chat.jsonl: every 'chat' training prompt (1,472)
#   prompts_replay.jsonl: evenly spaced training prompts of the other tasks (1,200)
import collections, json
rows = [json.loads(l) for l in open("assets/train/prompts.jsonl")]
train = [r for r in rows if r.get("split") == "train"]
with open("/work/data/prompts_chat.jsonl", "w") as f:
    for r in train:
        if r["task"] == "chat":
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
cap = {"chinese": 320, "code": 300, "chat-multiturn": 150, "creative": 150, "maths": 150,
       "summary": 70, "other-languages": 60}
by = collections.defaultdict(list)
for r in train:
    if r["task"] != "chat":
        by[r["task"]].append(r)
with open("/work/data/prompts_replay.jsonl", "w") as f:
    for task, rs in by.items():
        step = len(rs) / cap[task]
        for i in range(cap[task]):
            f.write(json.dumps(rs[int(i * step)], ensure_ascii=False) + "\n")
