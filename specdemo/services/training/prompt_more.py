"""The additions to the drafter-training prompt set after its first 617 rows: ~4,500 prompts
from templates, written for this project (nothing downloaded).

Tasks: multi-turn chat (rows carry ``messages``: earlier turns, then the user's last message, which
is also ``prompt``), code in several languages, arithmetic and word problems, summaries and
rewrites of a passage given in the prompt, creative writing, and prompts in Chinese (Traditional
and Simplified), French, Spanish and German. Deterministic for a seed. ``build`` puts
these after the first 617 rows, whose order and held-out split stay as they were
(``build``); ``python -m specdemo.services.training.prompt_more`` writes them all to ``PROMPTS_FILE``.
"""

from __future__ import annotations

import json
import random

from .prompt_set import HELDOUT_FRACTION, PROMPTS_FILE, build_wave2
from .prompt_set import ACTIVITIES, CHARACTERS, CODE_TASKS, EVENTS, FACTS, PLACES, POEM_TOPICS, THINGS, TOPICS

MORE_TOPICS = ["rainforests", "the Silk Road", "batteries", "the human brain", "wind turbines", "glaciers",
               "the printing of money", "migration of birds", "3D printing", "the Renaissance", "quantum computers",
               "the Pyramids of Giza", "cloud computing", "bacteria", "the ozone layer", "chess", "jazz music",
               "the Industrial Revolution", "smartphones", "the Amazon River", "earthworms", "satellites",
               "the periodic table", "vitamins", "the Moon's phases", "deserts", "the Cold War", "robots",
               "elections", "bridges", "lightning", "fermentation", "the Milky Way", "wolves", "paper",
               "GPS", "the stock exchange", "renewable energy", "memory", "ancient Egypt", "typhoons",
               "microplastics", "the speed of light", "volunteering", "mushrooms", "public libraries",
               "hydroelectric dams", "the metric system", "taxes", "the Internet of Things"]
ALL_TOPICS = TOPICS + MORE_TOPICS
CHAT_Q = ["What is {t}?", "Can you explain {t} in simple terms?", "Why does {t} matter?",
          "Tell me three interesting facts about {t}.", "How would you explain {t} to a child?",
          "What are the main ideas behind {t}?", "What is the history of {t}?",
          "What are common misconceptions about {t}?", "How does {t} affect everyday life?",
          "Write a short paragraph about {t}.", "What are the pros and cons of {t}?",
          "Give me a quick overview of {t} in five bullet points."]
FOLLOW_UPS = ["Can you give me an example?", "Can you make that shorter?", "Why is that?",
              "Explain that again, but for a ten-year-old.", "What should I read to learn more?",
              "Can you summarize that in one sentence?", "What is the most surprising part?",
              "How is that different from what people believed a hundred years ago?",
              "Thanks! Can you turn that into a short list?", "What would happen without it?"]
OPENERS = ["{t} is a topic many people find interesting. It has a long history and touches daily life.",
           "Sure. In short, {t} is easier to understand once you see how its parts fit together.",
           "Good question. {t} has a few key ideas that are worth knowing.",
           "Here is a brief explanation of {t} with the most important points."]
LANGS = {"Python": "python", "JavaScript": "javascript", "TypeScript": "typescript", "Go": "go",
         "Rust": "rust", "Java": "java", "C": "c", "C++": "cpp", "C#": "csharp", "Ruby": "ruby",
         "Bash": "bash", "Kotlin": "kotlin"}
MORE_CODE_TASKS = ["checks whether a string is a palindrome", "converts a number to binary",
                   "returns the unique words in a text", "finds the longest word in a sentence",
                   "computes the median of a list", "splits a list into chunks of size n",
                   "counts how many times each character appears in a string",
                   "checks whether a list is sorted", "computes the power of a number without a built-in",
                   "removes all whitespace from a string", "finds the index of the maximum value",
                   "reverses the words in a sentence", "computes the sum of squares of a list",
                   "converts a string to title case", "returns the first n prime numbers",
                   "checks whether parentheses in a string are balanced"]
ALL_CODE = CODE_TASKS + MORE_CODE_TASKS
CODE_T = ["Write a {l} function that {c}.", "Write a {l} function that {c}. Add a short comment.",
          "Write a {l} function that {c}, then show an example call.",
          "How would you write a {l} function that {c}? Explain it briefly."]
CODE_EXPLAIN = ["What does this {l} code do?\n\n```{tag}\n{code}\n```",
                "Find the bug in this {l} code and fix it:\n\n```{tag}\n{code}\n```",
                "Add comments to this {l} code:\n\n```{tag}\n{code}\n```",
                "Rewrite this {l} code to be easier to read:\n\n```{tag}\n{code}\n```"]
SNIPPETS = {
    "Python": ["def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)",
               "def g(s):\n    return s[::-1] == s",
               "def count(words):\n    d = {}\n    for w in words:\n        d[w] = d.get(w, 0) + 1\n    return d",
               "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return b"],
    "JavaScript": ["function f(arr) {\n  let m = arr[0];\n  for (let i = 1; i <= arr.length; i++) {\n    if (arr[i] > m) m = arr[i];\n  }\n  return m;\n}",
                   "const g = (s) => s.split('').reverse().join('');",
                   "function sum(a) {\n  return a.reduce((x, y) => x + y, 0);\n}"],
    "C": ["int f(int n) {\n    int r = 1;\n    for (int i = 2; i <= n; i++) r *= i;\n    return r;\n}",
          "int len(const char *s) {\n    int n = 0;\n    while (s[n]) n++;\n    return n;\n}"],
    "Go": ["func f(xs []int) int {\n\ts := 0\n\tfor _, x := range xs {\n\t\ts += x\n\t}\n\treturn s\n}"],
    "Rust": ["fn f(v: &Vec<i32>) -> i32 {\n    let mut m = v[0];\n    for x in v {\n        if *x > m { m = *x; }\n    }\n    m\n}"],
    "Java": ["public static boolean isEven(int n) {\n    return n % 2 == 0;\n}"],
}
CONCEPTS = ["a linked list", "a stack", "a queue", "a binary tree", "recursion", "a closure", "an interface",
            "garbage collection", "a race condition", "a deadlock", "a REST API", "a database index",
            "version control", "unit testing", "a hash function", "Big-O notation", "a compiler",
            "an operating system", "dynamic programming", "object-oriented programming",
            "functional programming", "a regular expression", "JSON", "an HTTP request", "a pointer"]
CONCEPT_T = ["Explain {x} with a short example.", "What is {x}? Keep it brief.",
             "When should a programmer use {x}?", "Explain {x} to a beginner."]
SUBJECTS = ["Anna", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kavya",
            "Liam", "Mei", "Noah", "Olga", "Pedro"]
PASSAGES = list(FACTS.values()) + [
    ["The bakery on Elm Street opened in 1952.", "It is still run by the same family.",
     "Its rye bread is known across the region.", "Last year it added a small cafe with six tables."],
    ["A new bus line will connect the university and the train station.",
     "Buses will run every ten minutes during the day.", "The service starts in September.",
     "Students will travel for free with their student card."],
    ["Volunteers cleaned two kilometres of the river bank on Saturday.",
     "They collected more than three hundred kilograms of rubbish.", "Most of it was plastic bottles and bags.",
     "The organisers plan to repeat the event every spring."],
    ["The company released a smaller, cheaper version of its phone.",
     "It has the same camera but a shorter battery life.", "Reviewers praised its size and price.",
     "Sales begin next month in twelve countries."],
    ["Scientists found a new species of frog in the mountains.",
     "It is only two centimetres long.", "Its call sounds like a cricket.",
     "The team warns that its forest habitat is shrinking."],
    ["The school introduced a four-day week as a trial.", "Lessons on the other days are longer.",
     "Teachers say pupils are less tired.", "Some parents worry about childcare on the free day."],
    ["The marathon had a record number of runners this year.", "More than twenty thousand people took part.",
     "The winner finished in just over two hours and eight minutes.", "Rain in the afternoon slowed the slower groups."],
    ["A storm damaged several roofs in the village overnight.", "Nobody was hurt.",
     "The power was out for about six hours.", "Repair crews expect to finish the work by Friday."],
    ["The city plans to plant ten thousand trees over five years.", "Most will go along main roads.",
     "Trees lower summer temperatures and clean the air.", "Residents can request a tree for their street online."],
    ["Our team finished the project two weeks early.", "The budget was slightly under the estimate.",
     "Testing found only minor problems.", "The next phase starts in January."],
]
SUMMARY_T = ["Summarize the following text in one sentence:\n\n{p}", "Give a short summary of this paragraph:\n\n{p}",
             "What is the main point of this text?\n\n{p}", "List the key facts in this text as bullet points:\n\n{p}",
             "Rewrite this text in simpler words:\n\n{p}", "Rewrite this text in a more formal style:\n\n{p}",
             "Turn this text into a short news headline and one sentence:\n\n{p}",
             "Answer in one word: is this text good news or bad news?\n\n{p}",
             "Rewrite this text as a short email to a friend:\n\n{p}",
             "Copy the second sentence of this text exactly:\n\n{p}",
             "Repeat this text, but change every past tense verb to present tense:\n\n{p}",
             "Translate this text into plain English for a child:\n\n{p}"]
MOODS = ["cheerful", "sad", "mysterious", "funny", "calm", "hopeful"]
FORMS = ["a short poem", "a haiku", "a limerick", "a four-line rhyme", "a short song verse"]
CREATIVE_T = ["Write {f} about {x}.", "Write a {m} short story about {c} who {e}.",
              "Write a short dialogue between {c} and {c2}.", "Describe {p} in a few sentences.",
              "Write the opening paragraph of a novel set in {p}.", "Write a short letter from {c} to a friend.",
              "Write a {m} poem about {x}."]
# Chinese: (Traditional, Simplified) pairs of topics and templates.
ZH_TOPICS = [("光合作用", "光合作用"), ("水循環", "水循环"), ("黑洞", "黑洞"), ("通貨膨脹", "通货膨胀"),
             ("疫苗", "疫苗"), ("網際網路", "互联网"), ("氣候變遷", "气候变化"), ("火山", "火山"),
             ("機器學習", "机器学习"), ("電動車", "电动车"), ("地震", "地震"), ("複利", "复利"),
             ("重力", "重力"), ("太陽能", "太阳能"), ("基因", "基因"), ("珊瑚礁", "珊瑚礁"),
             ("蜜蜂", "蜜蜂"), ("睡眠", "睡眠"), ("冥想", "冥想"), ("印刷術", "印刷术"),
             ("抗生素", "抗生素"), ("潮汐", "潮汐"), ("彩虹", "彩虹"), ("咖啡", "咖啡"),
             ("奧運會", "奥运会"), ("核能", "核能"), ("心臟", "心脏"), ("長城", "长城"),
             ("推測解碼", "推测解码"), ("大型語言模型", "大型语言模型"), ("記憶體頻寬", "内存带宽"),
             ("圖形處理器", "图形处理器"), ("茶", "茶"), ("熊貓", "熊猫"), ("春節", "春节")]
ZH_T = [("什麼是{t}？", "什么是{t}？"), ("請用簡單的話解釋{t}。", "请用简单的话解释{t}。"),
        ("{t}為什麼重要？", "{t}为什么重要？"), ("告訴我三個關於{t}的有趣事實。", "告诉我三个关于{t}的有趣事实。"),
        ("你會怎麼向小朋友解釋{t}？", "你会怎么向小朋友解释{t}？"), ("寫一段關於{t}的短文。", "写一段关于{t}的短文。"),
        ("{t}的優點和缺點是什麼？", "{t}的优点和缺点是什么？"), ("用英文簡單介紹{t}。", "用英文简单介绍{t}。")]
ZH_MATH = [("{a}加{b}等於多少？", "{a}加{b}等于多少？"), ("{a}乘以{c}是多少？請寫出步驟。", "{a}乘以{c}是多少？请写出步骤。"),
           ("{who}有{a}個蘋果，吃了{c}個，還剩幾個？", "{who}有{a}个苹果，吃了{c}个，还剩几个？"),
           ("解方程：{c}x + {a} = {s}。", "解方程：{c}x + {a} = {s}。")]
ZH_CODE = [("用Python寫一個函數，{c}。", "用Python写一个函数，{c}。"),
           ("請解釋這段程式碼：\n\n```python\n{code}\n```", "请解释这段代码：\n\n```python\n{code}\n```")]
ZH_CODE_TASKS = [("反轉一個字串", "反转一个字符串"), ("判斷一個數是不是質數", "判断一个数是不是质数"),
                 ("計算列表的平均值", "计算列表的平均值"), ("找出列表中最大的數", "找出列表中最大的数"),
                 ("計算n的階乘", "计算n的阶乘"), ("統計字串中每個字的次數", "统计字符串中每个字的次数")]
ZH_CREATIVE = [("寫一首關於{x}的短詩。", "写一首关于{x}的短诗。"), ("寫一個關於{x}的小故事。", "写一个关于{x}的小故事。")]
ZH_THEMES = [("月亮", "月亮"), ("秋天", "秋天"), ("大海", "大海"), ("友情", "友情"), ("家鄉", "家乡"),
             ("下雨天", "下雨天"), ("一隻貓", "一只猫"), ("老朋友", "老朋友")]
ZH_PASSAGES = [("小明每天早上六點起床，先跑步半小時，然後吃早餐。他說運動讓他一整天都很有精神。",
                "小明每天早上六点起床，先跑步半小时，然后吃早餐。他说运动让他一整天都很有精神。"),
               ("這家書店開業已經五十年了。雖然網路書店越來越多，老顧客還是喜歡來這裡看書、喝茶。",
                "这家书店开业已经五十年了。虽然网络书店越来越多，老顾客还是喜欢来这里看书、喝茶。"),
               ("推測解碼用一個小模型先猜幾個詞，再讓大模型一次驗證。猜得越準，生成就越快。",
                "推测解码用一个小模型先猜几个词，再让大模型一次验证。猜得越准，生成就越快。")]
ZH_SUMMARY = [("用一句話總結這段文字：\n\n{p}", "用一句话总结这段文字：\n\n{p}"),
              ("把這段文字翻譯成英文：\n\n{p}", "把这段文字翻译成英文：\n\n{p}"),
              ("重複這段文字：\n\n{p}", "重复这段文字：\n\n{p}")]
OTHER = {
    "fr": ["Qu'est-ce que {t} ?", "Explique {t} simplement.", "Donne-moi trois faits sur {t}."],
    "es": ["¿Qué es {t}?", "Explica {t} de forma sencilla.", "Dame tres datos sobre {t}."],
    "de": ["Was ist {t}?", "Erkläre {t} in einfachen Worten.", "Nenne drei Fakten über {t}."],
}
OTHER_TOPICS = {
    "fr": ["la photosynthèse", "le cycle de l'eau", "les volcans", "l'inflation", "les abeilles", "le café",
           "la Révolution française", "l'énergie solaire", "les trous noirs", "le sommeil"],
    "es": ["la fotosíntesis", "el ciclo del agua", "los volcanes", "la inflación", "las abejas", "el café",
           "la energía solar", "los agujeros negros", "el sueño", "el sistema solar"],
    "de": ["die Photosynthese", "der Wasserkreislauf", "Vulkane", "die Inflation", "Bienen", "Kaffee",
           "die Solarenergie", "schwarze Löcher", "der Schlaf", "das Sonnensystem"],
}


def _maths(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 12)
        d = rng.randint(2, 30)
        who, who2, what = rng.choice(SUBJECTS), rng.choice(SUBJECTS), rng.choice(THINGS)
        out.append(rng.choice([
            f"What is {a} + {b}?", f"What is {a} - {b}?", f"What is {b} * {c}?", f"What is {a} * {d}?",
            f"Compute {a} + {b} * {c} and explain the order of operations.",
            f"What is {b * c} divided by {c}? Show your steps.", f"What is {c * 5}% of {a * 10}?",
            f"Solve for x: {c}x + {a} = {a + c * b}.", f"Solve for x: {c}x - {b} = {c * d - b}.",
            f"{who} has {a} {what} and gives away {min(a - 1, b)}. How many are left?",
            f"{who} buys {c} packs of {what} with {b} in each pack. How many {what} is that in total?",
            f"{who} has {b} {what}. {who2} has {c} times as many. How many do they have together?",
            f"A car travels {b * c} km in {c} hours. What is its average speed?",
            f"A train leaves at {c}:00 and travels for {d % 9 + 1} hours. When does it arrive?",
            f"What is the area of a rectangle that is {b} cm long and {c} cm wide?",
            f"What is the perimeter of a square with sides of {b} m?",
            f"Is {a * 2 + 1} a prime number? Explain.", f"Convert {a * 100} metres to kilometres.",
            f"What is the average of {a}, {b} and {c}?", f"Round {a}.{b} to the nearest whole number.",
            f"A shirt costs ${b}. It is {c * 5}% off. What is the new price?",
            f"If {c} workers build a wall in {d} days, how long would {c * 2} workers take?",
            f"What is {c} squared plus {d} squared?", f"Write {a} in Roman numerals.",
            f"What is the next number in the sequence {c}, {2 * c}, {3 * c}, {4 * c}?",
            f"{who} saves ${b} a week. How much is saved after {d} weeks?"]))
    return out


def build_more(seed: int = 1) -> dict[str, list]:
    """{task: [prompt or {"prompt", "messages"}, ...]} for the added tasks, deterministic."""
    rng = random.Random(seed)
    chat = [t.format(t=x) for t in CHAT_Q for x in ALL_TOPICS]
    chat += [t.format(a=a) for t in ["What are good habits for {a}?", "How can I stay motivated when {a}?",
                                     "Write a checklist for {a}.", "What is a realistic goal for {a} in a month?"]
             for a in ACTIVITIES]
    multi = []
    for i in range(700):
        topic = rng.choice(ALL_TOPICS)
        first = rng.choice(CHAT_Q).format(t=topic)
        reply = rng.choice(OPENERS).format(t=topic[0].upper() + topic[1:])
        follow = rng.choice(FOLLOW_UPS)
        messages = [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": follow}]
        if i % 3 == 0:
            messages = messages[:2] + [{"role": "user", "content": rng.choice(FOLLOW_UPS)},
                                       {"role": "assistant", "content": "Of course. " + reply},
                                       {"role": "user", "content": follow}]
        multi.append({"prompt": follow, "messages": messages})
    code = [t.format(l=lang, c=c) for lang in LANGS for t in CODE_T for c in rng.sample(ALL_CODE, 9)]
    code += [t.format(l=lang, tag=LANGS[lang], code=s) for lang, ss in SNIPPETS.items() for s in ss
             for t in CODE_EXPLAIN]
    code += [t.format(x=x) for t in CONCEPT_T for x in CONCEPTS]
    code += [f"Translate this Python function into {lang}:\n\n```python\n{s}\n```"
             for lang in ["JavaScript", "Go", "Rust", "Java", "C++"] for s in SNIPPETS["Python"]]
    summary = []
    for p in PASSAGES:
        for t in SUMMARY_T:
            text = " ".join(rng.sample(p, k=len(p))) if rng.random() < 0.3 else " ".join(p)
            summary.append(t.format(p=text))
    creative = []
    for _ in range(700):
        c, c2 = rng.sample(CHARACTERS, 2)
        creative.append(rng.choice(CREATIVE_T).format(
            f=rng.choice(FORMS), x=rng.choice(POEM_TOPICS + ALL_TOPICS[:20]), m=rng.choice(MOODS), c=c, c2=c2,
            e=rng.choice(EVENTS), p=rng.choice(PLACES)))
    chinese = []
    for script in (0, 1):  # 0: Traditional, 1: Simplified
        chinese += [t[script].format(t=x[script]) for t in ZH_T for x in ZH_TOPICS]
        for _ in range(60):
            a, b, c = rng.randint(10, 99), rng.randint(2, 50), rng.randint(2, 9)
            chinese.append(rng.choice(ZH_MATH)[script].format(a=a, b=b, c=c, s=a + c * b,
                                                              who=rng.choice(["小明", "小華", "小美"])))
        chinese += [ZH_CODE[0][script].format(c=t[script]) for t in ZH_CODE_TASKS]
        chinese += [ZH_CODE[1][script].format(code=s) for s in SNIPPETS["Python"]]
        chinese += [t[script].format(x=x[script]) for t in ZH_CREATIVE for x in ZH_THEMES]
        chinese += [t[script].format(p=p[script]) for t in ZH_SUMMARY for p in ZH_PASSAGES]
    other = [t.format(t=x) for lang, ts in OTHER.items() for t in ts for x in OTHER_TOPICS[lang]]
    return {"chat": chat, "chat-multiturn": multi, "code": code, "maths": sorted(set(_maths(rng, 1400))),
            "summary": summary, "creative": creative, "chinese": chinese, "other-languages": other}


#: Everyday requests in phrasings the topic templates above never use (added after the first
#: heads were measured):
#: a head trained on "What is {t}?"-style templates accepted 2.20 tokens a step on held-out topics
#: of those templates and 1.54 on the benchmark's chat prompts. None of these repeats a benchmark
#: chat template ("Give me three tips for ...", "What should I pack for ...", "How do I politely
#: ...", "What is the difference between ...").
GOALS = ["get better at cooking", "keep my desk tidy", "spend less time on my phone", "learn to swim as an adult",
         "plan a birthday party", "eat more vegetables", "start running", "write a cover letter",
         "move to a new apartment", "organise my photos", "learn to play the guitar", "wake up earlier",
         "keep in touch with old friends", "get started with photography", "paint a room", "learn to draw",
         "prepare for a long flight", "host a dinner for six people", "build an emergency fund",
         "make my small kitchen work better", "take better notes in class", "get back into reading",
         "teach my child to ride a bike", "stick to a budget", "grow tomatoes on a balcony",
         "be more patient", "give a toast at a wedding", "choose a used car", "learn basic first aid",
         "plan a road trip", "cut down on coffee", "set up a home workout routine", "ask for a raise",
         "clean my oven", "care for a new kitten", "write a thank-you note", "prepare for a job fair",
         "volunteer in my town", "make a weekly meal plan", "reduce food waste"]
PAIRS = [("tea", "coffee"), ("renting", "buying a home"), ("a laptop", "a tablet"), ("walking", "cycling"),
         ("email", "a phone call"), ("paper books", "e-books"), ("a gas stove", "an induction hob"),
         ("trains", "planes"), ("a savings account", "index funds"), ("cats", "dogs"),
         ("working early", "working late"), ("group study", "studying alone"), ("yoga", "pilates"),
         ("a city", "the countryside"), ("handwritten notes", "typed notes"), ("LED bulbs", "halogen bulbs")]
PEOPLE = [("my landlord", "about a broken heater"), ("a neighbour", "about loud music at night"),
          ("my manager", "to ask for a day off"), ("a friend", "to apologise for missing their party"),
          ("my teacher", "to ask for more time on an essay"), ("a colleague", "to thank them for their help"),
          ("a shop", "to return a faulty kettle"), ("my team", "to announce that I am leaving"),
          ("a new client", "to introduce myself"), ("my sister", "to congratulate her on a new job")]
EVERYDAY_T = ["I want to {g}. Where should I start?", "What are some simple ways to {g}?",
              "Can you suggest a one-week plan to {g}?", "What mistakes do people make when they try to {g}?",
              "I keep failing to {g}. Any advice?", "Explain step by step how to {g}.",
              "My friend wants to {g}. What would you tell them?", "What do I need to {g}?"]
COMPARE_T = ["Which is better for me: {a} or {b}?", "Should I choose {a} or {b}? Help me decide.",
             "What are the trade-offs between {a} and {b}?"]
MESSAGE_T = ["Help me write a short message to {who} {why}.", "Draft a friendly email to {who} {why}."]
#: templates held out whole (split "heldout"): a check that a head generalises across phrasings
EVERYDAY_HELDOUT = {"My friend wants to {g}. What would you tell them?", "Draft a friendly email to {who} {why}."}


def _everyday() -> list[tuple[str, str]]:
    """(template, prompt) of every everyday chat prompt, in order."""
    rows = [(t, t.format(g=g)) for t in EVERYDAY_T for g in GOALS]
    rows += [(t, t.format(a=a, b=b)) for t in COMPARE_T for a, b in PAIRS]
    rows += [(t, t.format(who=w, why=y)) for t in MESSAGE_T for w, y in PEOPLE]
    return rows


def build_everyday() -> list[dict]:
    """Everyday chat rows (task "chat"), deterministic; two templates held out whole."""
    return [{"task": "chat", "prompt": prompt, "split": "heldout" if t in EVERYDAY_HELDOUT else "train"}
            for t, prompt in _everyday()]


def everyday_heldout() -> dict[str, list[str]]:
    """{held-out template: its prompts, in order} (``EVERYDAY_HELDOUT``, sorted)."""
    out: dict[str, list[str]] = {t: [] for t in sorted(EVERYDAY_HELDOUT)}
    for t, prompt in _everyday():
        if t in out:
            out[t].append(prompt)
    return out


def build(seed: int = 0) -> list[dict]:
    """Every prompt as {"task", "prompt", "split"[, "messages"]} (split: "train" or "heldout"),
    deterministic: the first 617 rows, unchanged, then the added tasks' rows, then the everyday chat
    rows (appended last so that the rows before keep their indices, which answers refer to)."""
    rows = build_wave2(seed)
    seen = {r["prompt"] for r in rows}
    rng = random.Random(seed + 1)
    for task, items in build_more(seed + 1).items():
        items = [i if isinstance(i, dict) else {"prompt": i} for i in items]
        items = [i for i in {(i["prompt"] if "messages" not in i else repr(i["messages"])): i
                             for i in items}.values() if "messages" in i or i["prompt"] not in seen]
        rng.shuffle(items)
        n_held = max(2, round(len(items) * HELDOUT_FRACTION))
        rows += [{"task": task, **i, "split": "heldout" if n < n_held else "train"} for n, i in enumerate(items)]
        seen.update(i["prompt"] for i in items)
    rows += [r for r in build_everyday() if r["prompt"] not in seen]
    return rows


def main() -> None:
    from ..prompts import load_prompts  # deferred: only the writer needs the bench prompts
    rows = build()
    bench = {p for ps in load_prompts().values() for p in ps}
    clash = [r["prompt"] for r in rows if r["prompt"] in bench]
    if clash:
        raise SystemExit(f"training prompts overlap the benchmark prompts: {clash[:3]}")
    PROMPTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    PROMPTS_FILE.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    counts = {}
    for r in rows:
        counts[(r["task"], r["split"])] = counts.get((r["task"], r["split"]), 0) + 1
    print(f"wrote {len(rows)} prompts to {PROMPTS_FILE}: {counts}")


if __name__ == "__main__":
    main()
