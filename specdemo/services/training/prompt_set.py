"""The drafter-training prompt set, generated from templates (written for this project; nothing
downloaded). ``python -m specdemo.services.training.prompt_more`` rewrites ``assets/train/prompts.jsonl``
(``prompt_more.build``: the first 617 rows, from this module, then ``prompt_more``'s).

The first rows: five tasks (chat, code, maths, summaries, creative writing), 617 prompts.
``prompt_more`` adds ~4,500 more (multi-turn chat, code in twelve languages, word problems,
rewrites of a given passage, creative writing, Chinese in both scripts, French, Spanish, German). A seeded
tenth of each task is held out for the training report; the first 617 rows keep their split. None of
them is one of the benchmark prompts under ``assets/prompts/`` (checked when written). A row may
carry ``messages`` (earlier turns of a conversation); its ``prompt`` is the last user message.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ... import PROJECT_DIR

PROMPTS_FILE = PROJECT_DIR / "assets" / "train" / "prompts.jsonl"
HELDOUT_FRACTION = 0.1

TOPICS = ["photosynthesis", "the water cycle", "black holes", "inflation", "vaccines", "the internet",
          "democracy", "climate change", "volcanoes", "the Roman Empire", "machine learning",
          "electric cars", "the immune system", "earthquakes", "compound interest", "gravity",
          "the French Revolution", "recycling", "solar power", "DNA", "the stock market",
          "coral reefs", "the moon landing", "honey bees", "blockchains", "sleep", "meditation",
          "the printing press", "antibiotics", "tides", "rainbows", "jet engines", "coffee",
          "the Olympic Games", "plate tectonics", "supply and demand", "nuclear energy",
          "the human heart", "bread baking", "the Great Wall of China"]
ACTIVITIES = ["learning a new language", "running a marathon", "saving money", "studying for exams",
              "cooking at home", "working from home", "starting a garden", "public speaking",
              "writing a resume", "travelling on a budget", "staying focused", "making friends in a new city",
              "learning to code", "keeping a houseplant alive", "drinking more water", "reading more books",
              "preparing for a job interview", "reducing stress", "training a puppy", "cycling to work"]
CHAT = ["What is {t}?", "Can you explain {t} in simple terms?", "Why does {t} matter?",
        "Tell me three interesting facts about {t}.", "How would you explain {t} to a child?",
        "What are the main ideas behind {t}?"]
CHAT_ACT = ["Give me three tips for {a}.", "What are the benefits of {a}?", "How do I get started with {a}?",
            "What mistakes should I avoid when {a}?", "Make a simple one-week plan for {a}."]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
              "counts the vowels in a string", "finds the largest number in a list",
              "removes duplicates from a list while keeping order", "merges two sorted lists",
              "converts Celsius to Fahrenheit", "checks whether two strings are anagrams",
              "flattens a nested list", "computes the factorial of n", "sums the digits of an integer",
              "returns the words of a sentence sorted by length", "counts word frequencies in a text",
              "checks whether a year is a leap year", "computes the average of a list of numbers",
              "finds the second smallest element of a list", "capitalizes the first letter of every word",
              "returns all even numbers from a list", "validates a simple email address",
              "computes the greatest common divisor of two numbers", "rotates a list by k positions",
              "transposes a matrix given as a list of lists", "does a binary search in a sorted list"]
CODE = ["Write a Python function that {c}.", "Write a Python function that {c}. Add a short docstring.",
        "Write a JavaScript function that {c}.", "Write a Python function that {c}, then show an example call."]
CODE_EXTRA = ["Explain the difference between a list and a tuple in Python.",
              "What does the `yield` keyword do in Python?", "Explain what a hash map is.",
              "What is recursion? Give a short Python example.", "Explain Big-O notation with an example.",
              "Write a SQL query that selects all users older than 30 from a table `users`.",
              "What is the difference between `==` and `is` in Python?",
              "Write a Python class `Counter` with increment, decrement and reset methods.",
              "Write a bash command that counts the lines in all .txt files in a folder.",
              "Explain what a REST API is."]
SUBJECTS = ["Anna", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro"]
THINGS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "cards", "shells"]
PLACES = ["a quiet harbour town", "a busy night market", "an old library", "a mountain village in winter",
          "a desert at dawn", "a space station", "a forest after rain", "a seaside cafe"]
POEM_TOPICS = ["the ocean", "a city at night", "friendship", "the first snow", "an old clock", "the stars",
               "a cup of tea", "spring flowers", "a train journey", "the wind", "a lost key", "autumn leaves",
               "the moon", "a sleeping cat", "the sunrise", "a letter from home"]
CHARACTERS = ["a young inventor", "a retired sailor", "a curious robot", "a shy dragon", "a baker",
              "a lonely astronaut", "a clever fox", "a night-shift nurse", "a street musician", "a lost dog"]
EVENTS = ["finds a hidden door", "wins an unexpected prize", "meets an old friend", "gets lost in a storm",
          "discovers a secret map", "learns to fly", "opens a mysterious box", "has to save the town festival"]
FACTS = {
    "the bicycle": ["The first bicycles appeared in the early nineteenth century.",
                    "Early models had no pedals and riders pushed with their feet.",
                    "Pedals, chains and air-filled tyres were added over the following decades.",
                    "Today bicycles are used for transport, sport and leisure all over the world."],
    "tea": ["Tea is made by pouring hot water over the cured leaves of the tea plant.",
            "It was first drunk in China thousands of years ago.",
            "Traders carried it along land and sea routes to Europe and beyond.",
            "It is now one of the most popular drinks in the world after water."],
    "the library project": ["The town council met on Monday to discuss the new library.",
                            "The building will cost more than planned because of rising material prices.",
                            "Councillors agreed to delay the opening by six months.",
                            "Residents will be asked for their views at a meeting next month."],
    "sleep research": ["Researchers followed two hundred adults for one year.",
                       "People who slept less than six hours reported more colds.",
                       "Those who kept regular bedtimes felt more rested, even with the same hours.",
                       "The authors say regular routines may matter as much as total sleep."],
    "urban gardens": ["Community gardens are spreading in many cities.",
                      "They turn empty lots into places to grow vegetables and flowers.",
                      "Neighbours who garden together report feeling more connected.",
                      "Some cities now offer small grants to start new gardens."],
    "the museum": ["The city museum reopened after a two-year renovation.",
                   "It now has a new wing for modern art and a larger children's area.",
                   "Entry remains free on the first Sunday of every month.",
                   "Visitor numbers in the first week were twice the usual level."],
}
SUMMARY = ["Summarize the following text in one sentence:\n\n{p}",
           "Give a short summary of this paragraph:\n\n{p}",
           "What is the main point of this text?\n\n{p}",
           "List the key facts in this text as bullet points:\n\n{p}",
           "Rewrite this text in simpler words:\n\n{p}"]


def _maths(rng: random.Random) -> list[str]:
    out = []
    for _ in range(150):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
        who, what = rng.choice(SUBJECTS), rng.choice(THINGS)
        out += [rng.choice([f"What is {a} + {b} * {c}? Explain the order of operations.",
                            f"What is {a * c} divided by {c}? Show your steps.",
                            f"What is {c * 5}% of {a * 10}?",
                            f"Solve for x: {c}x + {a} = {a + c * b}.",
                            f"{who} has {a} {what} and gives away {min(a - 1, b)}. How many are left?",
                            f"{who} buys {c} packs of {what} with {b} in each pack. How many {what} is that in total?",
                            f"A car travels {a * c} km in {c} hours. What is its average speed?",
                            f"What is the area of a rectangle that is {a} cm long and {c} cm wide?",
                            f"Is {a * 2 + 1} a prime number? Explain.",
                            f"Convert {a * 100} metres to kilometres."])]
    return out


def build_wave2(seed: int = 0) -> list[dict]:
    """The first 617 rows of the prompt set, unchanged since they were written: their held-out
    split stays held out (``build_wave2`` is the name they were first built under)."""
    rng = random.Random(seed)
    tasks = {
        "chat": [t.format(t=x) for t in CHAT for x in TOPICS[:24]] +
                [t.format(a=x) for t in CHAT_ACT for x in ACTIVITIES],
        "code": [t.format(c=x) for t in CODE for x in CODE_TASKS] + CODE_EXTRA,
        "maths": sorted(set(_maths(rng))),
        "summary": [t.format(p=" ".join(rng.sample(s, k=len(s)) if i % 2 else s))
                    for t in SUMMARY for i, s in enumerate(FACTS.values())],
        "creative": [f"Write a short poem about {x}." for x in POEM_TOPICS] +
                    [f"Write a haiku about {x}." for x in POEM_TOPICS] +
                    [f"Write a short story about {c} who {e}." for c in CHARACTERS for e in EVENTS[:5]] +
                    [f"Describe {p} in a few sentences." for p in PLACES],
    }
    rows = []
    for task, prompts in tasks.items():
        prompts = list(dict.fromkeys(prompts))
        rng.shuffle(prompts)
        n_held = max(2, round(len(prompts) * HELDOUT_FRACTION))
        rows += [{"task": task, "prompt": p, "split": "heldout" if i < n_held else "train"}
                 for i, p in enumerate(prompts)]
    return rows


def load(path: Path = PROMPTS_FILE, split: str | None = None) -> list[dict]:
    """Rows of a prompts file ({"task", "prompt"[, "split"]} per line); only ``split`` if given.

    Raises:
        ValueError: a line that is not such an object (with its line number).
    """
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            assert isinstance(row["prompt"], str) and row["prompt"].strip()
        except (ValueError, KeyError, TypeError, AssertionError):
            raise ValueError(f"{path}:{n}: expected a JSON object with a non-empty \"prompt\"") from None
        messages = row.get("messages")
        if messages is not None and not (
                isinstance(messages, list) and messages and all(
                    isinstance(m, dict) and m.get("role") in ("user", "assistant", "system")
                    and isinstance(m.get("content"), str) for m in messages)
                and messages[-1]["role"] == "user"):
            raise ValueError(f"{path}:{n}: \"messages\" must be a list of {{role, content}} ending with a user turn")
        row.setdefault("task", "chat")
        row.setdefault("split", "train")
        if split is None or row["split"] == split:
            rows.append(row)
    return rows
