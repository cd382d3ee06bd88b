"""Seed lists for the prompt set at scale (``prompt_scale``): topics, goals, task kinds and
registers, written for this project (nothing downloaded).

A seeded prompt is a task kind's phrasing filled with a topic (or a goal, a pair, a code task),
then put in a register: plain, terse, chatty, misspelled, with a persona, or two asks in one.
None of these lists names a topic of a held-out family of the split (``split.py``: personal
finance, parenting, car maintenance, history questions, tech support, fashion and grooming,
everyday environment, coding help, food and cooking, health, relationships and friends, tech
gadgets, writing and language, OOP, concurrency, debugging, numeric code, mobile apps, algebra,
percentages and discounts, unit conversion, bike commuting, birdwatching, small business,
television and films, jokes, slogans, meeting notes, product reviews); ``prompt_scale.build``
also drops any row that is a near-duplicate of a held-out prompt or whose words lean on a
held-out family, and ``tests/test_prompt_scale.py`` checks the shipped file.
"""

from __future__ import annotations

TOPICS = """
how rainbows form | why the sky is blue | how tides work | how volcanoes erupt | how earthquakes are measured |
the water cycle | how clouds form | why leaves change colour in autumn | how bees make honey | how ants find food |
how bats navigate in the dark | why cats purr | how octopuses change colour | how whales communicate |
how birds stay warm in winter | how spiders spin webs | how seeds know which way is up | how coral grows |
the life cycle of a butterfly | how frogs breathe | why zebras have stripes | how camels survive in the desert |
how snakes move without legs | how jellyfish live without a brain | how trees drink water | how mushrooms grow |
how fireflies glow | how penguins keep their eggs warm | why some animals hibernate | how salmon find their river |
how magnets work | how electricity reaches a house | how batteries store energy | how a microwave oven heats food |
how a refrigerator keeps things cold | how lenses bend light | how sound travels | why ice floats |
what makes thunder | how a rocket reaches orbit | how satellites stay up | how a compass works |
how airplanes stay in the air | how submarines dive and surface | how a bicycle stays upright | how a lock and key work |
how glass is made | how paper is recycled | how soap cleans | how a thermometer works | how a pendulum clock keeps time |
what a black hole is | how stars are born | why planets are round | how the Moon affects Earth | what the Big Bang theory says |
why Mars is red | how long light from the Sun takes to reach us | what a comet is made of | how the seasons happen |
what dark matter might be | how astronauts sleep in space | why Saturn has rings | how we know the age of the Earth |
what an atom is made of | how chemical reactions release heat | what a catalyst does | why metals rust |
how salt dissolves in water | what pH means | why some materials conduct electricity | how crystals form |
how the heart pumps blood | how the lungs exchange gases | how muscles grow | how the eye sees colour | how we hear sounds |
how memory works in the brain | why we dream | why we yawn | how the sense of smell works | how fingerprints form |
how the body fights a fever | why we get goosebumps | how bones heal | how the stomach digests food |
how a search engine finds pages | how email travels across the world | how a computer adds numbers |
what an operating system does | how data is compressed | how encryption keeps messages private | what a database is |
how a web browser shows a page | how GPS finds your position | how a touchscreen senses a finger | what cloud storage is |
how machine translation works | what a neural network is | how a QR code stores information | what open source software is |
how a 3D printer builds objects | how a robot vacuum maps a room | what a programming language is | how video streaming works |
how maps are made | why time zones exist | how a dam produces power | how wind turbines work | how a nuclear reactor works |
how bridges carry heavy loads | how skyscrapers resist wind | how tunnels are dug under rivers | how trains switch tracks |
how an elevator works | how a lighthouse works | how canals lift boats | how roads are built |
the rules of chess | how to get better at chess | the rules of basketball | the offside rule in football |
how a marathon is scored | how tennis scoring works | the basics of rock climbing | how to start swimming laps |
the rules of volleyball | how a relay race works | what makes a good goalkeeper | how cricket is played |
the basics of playing the piano | how to read sheet music | how a guitar makes sound | what makes a melody catchy |
how an orchestra is organised | the basics of drawing with perspective | how watercolour painting works |
how to take better photos at night | what makes a good short story | how to write a haiku | how a film camera works |
what a museum curator does | how theatre actors remember their lines | how animation is made | what makes a good podcast |
how a library organises books | what an encyclopedia is for | how dictionaries are written | how newspapers check facts |
how elections count votes | what a constitution is | how a court trial works | what the United Nations does |
how a city plans its streets | what a census is | how recycling centres sort waste | how a post office delivers letters |
how a volcano island forms | why deserts are dry | how rivers shape valleys | how glaciers move | why the Dead Sea is so salty |
how caves form | why Iceland has so many volcanoes | how the Amazon rainforest makes rain | what causes a tsunami |
why the Sahara was once green | how mountains are formed | what lives at the bottom of the ocean |
how coffee beans are roasted | how tea is grown | how chocolate is made from cacao | how cheese is made |
how bread rises | how ice cream is made | how olive oil is pressed | how sugar is made from sugarcane |
how a beehive is organised | how wolves live in packs | how elephants remember | how dolphins sleep | how parrots learn words |
why dogs wag their tails | how horses sleep standing up | how owls hunt at night | how crows solve puzzles |
what makes a good habit | why people procrastinate | how to concentrate for longer | how to remember names |
how to learn faster | why music gives us chills | why people like scary stories | how optical illusions trick us |
how a board game is designed | how crossword puzzles are made | what makes a riddle clever | how magic tricks work |
how a hot air balloon flies | how parachutes slow a fall | how kites fly | how sailboats sail against the wind |
how a solar eclipse happens | why the Moon has phases | how the northern lights appear | why stars twinkle |
how vaccines train the immune system | how antibiotics kill bacteria | what a virus is | how doctors use X-rays
"""

GOALS = """
learn to juggle | get better at public speaking | keep a daily journal | learn touch typing | start bouldering |
train for a 10k run | learn to knit a scarf | build a bookshelf | sleep on a regular schedule | learn sign language |
grow herbs on a windowsill | start a book club | learn to play chess online | memorise a poem | learn to sail |
start a vegetable patch | go on long nature walks | practise mindfulness | learn calligraphy |
plan a camping weekend | organise a neighbourhood clean-up | learn to ice skate | start learning the violin |
prepare for a driving test | make my mornings less rushed | learn to paint with acrylics | build a simple website |
learn basic Spanish before a trip | start a running streak | declutter my bookshelves | learn to dance salsa |
practise handwriting | plan a hiking trip in the mountains | start a photography project | learn to meditate |
train my dog to walk on a lead | teach my cat a trick | set up a fish tank | care for a pet rabbit | adopt a rescue dog |
write a short novel | enter a poetry contest | learn to solve a Rubik's cube | get better at mental arithmetic |
prepare for a chess tournament | learn to swim butterfly | start a podcast | make a family tree | learn origami |
organise a board game night | plan a surprise party | run a quiz night | learn to play the harmonica |
prepare for a job interview | write a personal statement | negotiate a job offer | change careers at 40 |
get organised at work | run better meetings | give feedback to a colleague | lead a small team for the first time |
ask a mentor for advice | prepare a presentation in one day | stop checking email all day | plan a study timetable |
revise for a maths exam | learn vocabulary faster | write an essay under time pressure | stay calm during exams |
clean a cluttered garage | fix a squeaky door | patch a hole in a wall | hang a heavy mirror | unclog a sink |
paint a fence | set up a home office | make a small room feel bigger | move house without stress |
plan a trip to Japan | pack light for two weeks | get over jet lag | find cheap train tickets in Europe |
plan a first visit to Paris | travel alone for the first time | plan a road trip along the coast | go island hopping |
learn to climb a rope | improve my posture | stretch after a long day at a desk | start yoga at home |
build a habit of drinking water | walk ten thousand steps a day | get back into exercise after a break |
volunteer at an animal shelter | mentor a student | organise a charity run | write letters to a pen pal
"""

PAIRS = """
a kayak | a canoe ; chess | go ; hiking boots | trail runners ; a tent | a hammock ; watercolour | oil paint ;
a piano | a keyboard ; learning guitar | learning ukulele ; a gym membership | running outside ;
a desk job | a job outdoors ; studying in the morning | studying at night ; flashcards | practice tests ;
a paper planner | a calendar app ; a train | a bus for a long trip ; a hostel | a hotel ; a beach holiday | a city break ;
a cat | a rabbit ; a dog from a shelter | a puppy from a breeder ; a big city | a small town ; a window seat | an aisle seat ;
swimming | running ; yoga | stretching ; board games | video games ; fiction | non-fiction ; poetry | prose ;
a sketchbook | a tablet for drawing ; a film camera | a phone camera ; theatre | live music ;
a university degree | an apprenticeship ; working alone | working in a team ; a big company | a start-up ;
a standing desk | a normal desk ; a mountain bike | a road bike ; tennis | badminton ; climbing | bouldering
"""

PERSONAS = """
a nurse on night shifts | a first-year university student | a retired teacher | a software tester | a chef |
a farmer | a librarian | a bus driver | an architect | a new manager | a graduate looking for work | a carpenter |
a museum guide | a hotel receptionist | a postman | a pharmacist | a translator | a musician | a graphic designer |
a lab technician | a lifeguard | a tour guide | a baker | a journalist | a shop assistant | a physics student |
a volunteer firefighter | an amateur astronomer | a marathon runner | a beginner gardener | a chess club member |
an exchange student in Germany | someone who just moved to a new city | someone learning English |
someone who works from a boat | a night-owl programmer | a choir singer | a park ranger | a potter | a beekeeper
"""

#: phrasings that take a topic ``{t}`` (``*``: only a topic that is not itself a how/why/what clause)
TOPIC_T = """
*What is {t}? | Explain {t}. | Can you explain {t} in simple terms? | How would you explain {t} to a ten-year-old? |
Give me a short explanation of {t}. | Tell me about {t}. | I never understood {t}. Can you help? |
Summarise {t} in three sentences. | What are the key facts about {t}? | Write a short paragraph about {t}. |
Explain {t} step by step. | What is the science behind {t}? | List five things everyone should know about {t}. |
What questions do people usually ask about {t}? | Write a short quiz with three questions about {t}. |
Explain {t} using an everyday analogy. | What is a common misunderstanding about {t}? |
Describe {t} as if you were a tour guide. | *Give me a one-sentence answer: {t}? | Teach me {t} in two minutes. |
Write a haiku about {t}. | Write a short poem about {t}. | Explain {t} like a friendly science teacher. |
What would a scientist say about {t}? | Write three flashcards about {t}. | Make a short outline for a talk on {t}. |
Explain {t} and then give one surprising fact. | Why is {t} interesting? | How did people first figure out {t}? |
Write a children's story that explains {t}. | What experiments show {t}? | Draw a comparison: {t} and something from daily life. |
Give me the short version of {t}, then the long version. | Write a tweet-length explanation of {t}. |
What vocabulary do I need to talk about {t}? | Explain {t} in bullet points. | *Is it true that {t} is simple once you see it? |
Create a mnemonic to remember {t}. | I have a test tomorrow on {t}. What should I focus on?
"""

#: phrasings that take a goal ``{g}`` (none of the split's held-out templates)
GOAL_T = """
How do I {g}? | I'd like to {g}. What's the first step? | Give me a simple plan to {g}. | Any tips to {g}? |
What's the fastest way to {g}? | I have one month to {g}. How should I use it? | What do beginners get wrong when they {g}? |
Make a checklist to {g}. | Break down how to {g} into small steps. | What equipment do I need to {g}? |
Is it realistic to {g} in a few weeks? | Motivate me to {g}. | What should I know before I try to {g}? |
How much time a week does it take to {g}? | Write a 7-day schedule to {g}. | I tried to {g} and gave up. What now? |
What's a good first goal if I want to {g}? | Explain how to {g} to a complete beginner. |
How can I {g} without spending much money? | How do I keep going once I start to {g}? | Help me {g}.
"""

PAIR_T = """
{a} or {b}: which should I pick? | Compare {a} and {b}. | What's the difference between {a} and {b}? |
Pros and cons of {a} versus {b}? | I can't decide between {a} and {b}. Help me think it through. |
Which is easier for a beginner, {a} or {b}? | Make a table comparing {a} and {b}.
"""

PERSONA_T = """
I'm {p}. {q} | As {p}, I wonder: {q} | I work as {p}. {q} | Context: I'm {p}. {q}
"""

WRITING = """
a thank-you note to a neighbour who watered my plants | an invitation to a board game evening |
a short speech for a friend's retirement | a welcome message for new members of a hiking club |
a notice about a lost umbrella at the library | a message asking to swap shifts with a colleague |
a reminder about a choir rehearsal | a short bio for a volunteer website | an announcement of a chess tournament |
a postcard from a holiday by the sea | a note to a teacher thanking them for a great year |
a message to a flatmate about cleaning the kitchen | a welcome speech for a science fair |
a letter to a pen pal in another country | a short review of a museum visit | a description of my hometown |
a motivational message for a running group | a story about a lighthouse keeper | a poem about the first snow |
a fable about a clever crow | a short mystery set on a train | a dialogue between the Sun and the Moon |
a limerick about a sleepy owl | a story about a robot that learns to paint | a diary entry of an astronaut |
an acrostic poem for the word OCEAN | a bedtime story about a brave little boat | a scene in a busy railway station |
a letter from a tree to the people in the park | a story that starts with a knock at the door at midnight
"""

WRITE_T = """
Write {w}. | Please write {w}. | Draft {w}. | Can you write {w}? | Write {w}, about 100 words. |
Write {w} in a warm tone. | Write {w}. Keep it short. | Help me write {w}.
"""

CODE_LANGS = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "C#", "Ruby", "PHP",
              "Kotlin", "Swift", "Bash", "Lua", "Haskell", "R", "Julia", "Scala", "Dart"]

CODE_TASKS = """
reverses the words of a sentence | counts the lines of a text file | checks if a string is a palindrome |
merges two dictionaries | finds duplicate items in a list | groups words by their first letter |
parses a date like 2024-05-01 into day, month and year | 
reads a CSV file and prints each row | writes a list of strings to a file, one per line |
returns the longest common prefix of a list of strings | removes punctuation from a string |
converts a string to snake_case | converts snake_case to camelCase | 
 returns the k most common words in a text | validates a hex colour code |
 splits a string on commas and trims spaces | chunks a list into pairs |
checks if two lists have any element in common | returns the intersection of two lists | zips two lists into pairs |
counts the words in a string |  builds a frequency table of letters |
finds the first non-repeating character | reverses a linked list | implements a stack with push and pop |
implements a queue with two stacks | does a breadth-first search on a graph | does a depth-first search on a tree |
sorts a list of people by age | sorts words by length then alphabetically | implements insertion sort |
implements merge sort | implements quicksort | finds the maximum subarray sum | checks if a grid of brackets is balanced |
matches an email address with a regular expression | extracts all numbers from a string | masks all but the last four digits of a card number |
pads a string to a fixed width | wraps text at 40 characters | generates a random password | shuffles a list |
picks a random element from a list | counts files in a directory | lists files modified today | reads environment variables with a default |
sends an HTTP GET request and prints the status code | parses a JSON string into an object | pretty-prints JSON |
computes the number of days between two dates | prints a calendar for a month | converts minutes into hours and minutes |
 

draws a triangle of stars | prints FizzBuzz up to 100 | finds all anagrams of a word in a list | counts vowels and consonants |
removes empty strings from a list | deduplicates a list of records by id | caches the results of a slow function |
retries a function up to three times | times how long a function takes | logs a message with a timestamp |
reads a config file of key=value lines | parses command-line arguments | validates that a string is a valid IPv4 address |
converts a list of pairs into a dictionary | inverts a dictionary | flattens a dictionary of dictionaries |
finds the most frequent element | checks if a sentence is a pangram | counts uppercase letters | swaps two variables
"""

CODE_T = """
Write a {l} function that {c}. | In {l}, write a function that {c}. | Show me {l} code that {c}. |
Write a {l} function that {c}, with a short comment on each step. | How do I write a function in {l} that {c}? |
Write a {l} program that {c} and show its output. | I need a {l} snippet that {c}. | Give me an idiomatic {l} function that {c}. |
Write a {l} function that {c} and add two tests. | Explain how to write a {l} function that {c}, then write it.
"""

CODE_CONCEPTS = """
a closure | a generator | an iterator | a hash table | a binary search tree | a heap | a trie | dynamic programming |
memoisation | tail recursion | a regular expression | a lambda function | a pure function | immutability |
pattern matching | a type system | garbage collection | a stack overflow | a shell pipe | a cron job |
a REST API | a JSON schema | an SQL join | an index in a database | a foreign key | a transaction in SQL |
unit testing | continuous integration | semantic versioning | a pull request | code review | a linked list
"""

CONCEPT_T = """
Explain {x} with a short {l} example. | What is {x}? Show it in {l}. | When would I use {x} in {l}? |
Give a simple {l} example of {x} and explain each line.
"""

#: Traditional Chinese seeds (Simplified ones are converted with OpenCC)
ZH_TOPICS = """
彩虹是怎麼形成的 | 天空為什麼是藍色的 | 潮汐 | 火山爆發 | 地震的規模 | 雲的形成 | 秋天樹葉變色 | 蜜蜂釀蜜 |
螞蟻如何找食物 | 蝙蝠如何在黑暗中飛行 | 章魚變色 | 鯨魚的溝通 | 蜘蛛結網 | 蝴蝶的一生 | 駱駝如何在沙漠生存 |
磁鐵的原理 | 電池如何儲存能量 | 微波爐如何加熱食物 | 冰箱如何保持低溫 | 聲音如何傳播 | 冰為什麼會浮在水上 |
打雷的原因 | 火箭如何進入軌道 | 人造衛星 | 飛機為什麼能飛 | 潛水艇如何下潛 | 腳踏車為什麼不會倒 |
玻璃的製造 | 肥皂為什麼能去污 | 黑洞 | 恆星的誕生 | 月亮對地球的影響 | 四季的成因 | 土星環 | 原子的結構 |
金屬為什麼會生鏽 | 晶體的形成 | 心臟如何跳動 | 肺如何呼吸 | 肌肉如何變強 | 眼睛如何看見顏色 | 記憶 | 做夢 |
打哈欠 | 指紋 | 搜尋引擎 | 電子郵件如何傳送 | 作業系統 | 資料壓縮 | 加密 | 資料庫 | 衛星定位 | 觸控螢幕 |
機器翻譯 | 神經網路 | 二維碼 | 開源軟體 | 三維列印 | 串流影音 | 時區 | 水壩發電 | 風力發電 | 橋樑的結構 |
摩天大樓如何抗風 | 電梯的原理 | 燈塔 | 西洋棋的規則 | 圍棋 | 籃球規則 | 馬拉松 | 網球計分 | 鋼琴入門 | 讀五線譜 |
吉他如何發聲 | 水彩畫 | 夜間攝影 | 短篇小說的寫作 | 俳句 | 動畫的製作 | 圖書館如何分類書籍 | 字典的編寫 |
選舉計票 | 法院審判 | 城市規劃 | 人口普查 | 郵局如何送信 | 沙漠為什麼乾燥 | 河流如何塑造山谷 | 冰川 | 洞穴的形成 |
海嘯 | 山脈的形成 | 深海生物 | 咖啡豆烘焙 | 茶葉的種植 | 巧克力的製作 | 起司的製作 | 蜂巢 | 狼群 | 大象的記憶 |
海豚睡覺 | 鸚鵡學說話 | 烏鴉的聰明 | 好習慣的養成 | 拖延症 | 專注力 | 記住別人的名字 | 錯覺 | 魔術的原理 |
熱氣球 | 降落傘 | 風箏 | 帆船 | 日食 | 月相 | 極光 | 星星為什麼會閃爍 | 疫苗的原理 | 病毒
"""

ZH_T = """
什麼是{t}？ | 請解釋{t}。 | 請用簡單的話解釋{t}。 | 你會怎麼向十歲的孩子解釋{t}？ | 用三句話說明{t}。 |
關於{t}，有哪些重要的知識？ | 寫一段關於{t}的短文。 | 一步一步解釋{t}。 | 列出關於{t}的五個重點。 |
寫三道關於{t}的小測驗題。 | 用生活中的比喻解釋{t}。 | 關於{t}，常見的誤解是什麼？ | 寫一首關於{t}的短詩。 |
我一直搞不懂{t}，可以幫我嗎？ | 明天要考{t}，我該注意什麼？ | 用條列的方式介紹{t}。 | {t}有什麼有趣的地方？ |
請用英文和中文各寫一句話介紹{t}。 | 給我一個關於{t}的冷知識。 | 幫我做一份關於{t}的簡報大綱。
"""

ZH_GOALS = """
學會游泳 | 每天寫日記 | 練習打字 | 準備馬拉松 | 學習打毛線 | 學日文 | 學吉他 | 學下圍棋 | 早睡早起 |
整理房間 | 準備面試 | 寫履歷 | 規劃日本旅行 | 練習書法 | 學畫畫 | 開始健走 | 培養閱讀習慣 | 訓練小狗 |
照顧兔子 | 種香草 | 學攝影 | 準備考試 | 學做麵包 | 學騎單輪車 | 組織讀書會 | 練習演講 | 學習冥想 |
規劃露營 | 學溜冰 | 背英文單字
"""

ZH_GOAL_T = """
我想{g}，該從哪裡開始？ | 給我一個{g}的簡單計畫。 | {g}有什麼訣竅？ | 初學者{g}常犯什麼錯？ |
幫我列一份{g}的清單。 | 我只有一個月，要怎麼{g}？ | 怎麼樣才能持續{g}？ | 請把{g}拆成幾個小步驟。
"""

ZH_CODE_T = """
用{l}寫一個函式，{c}。 | 請用{l}實作：{c}。 | 我需要一段{l}程式碼，{c}，並加上註解。
"""

ZH_CODE_TASKS = """
把字串反轉 | 判斷一個數是不是質數 | 計算串列的平均值 | 找出串列中最大的數 | 統計每個字出現的次數 |
把攝氏轉成華氏 | 判斷是否為閏年 | 合併兩個已排序的串列 | 移除串列中的重複元素 | 計算階乘 |
讀取文字檔並計算行數 | 把數字轉成二進位 | 檢查括號是否成對 | 找出兩個串列的交集 | 產生費氏數列
"""

MULTI_JOIN = [" Also, ", " And one more thing: ", " Second question: ", "\n\nAlso: ", " Oh, and ", "\n\n2) "]
CHATTY_OPEN = ["Hey! ", "Hi there, ", "Quick question: ", "Okay so ", "Hello :) ", "Hiya, ", "Good morning! ",
               "Random question, ", "Sorry if this is basic, but ", "Hey, hope you're well. "]
CHATTY_CLOSE = [" Thanks!", " Thanks in advance.", " I'd really appreciate it.", " No rush.", " Cheers!",
                " Thank you so much!", " :)", " Keep it simple please.", " Be honest.", ""]
#: follow-ups to one of the target's own answers (multi-turn rows)
FOLLOW_UPS = """
Can you make that shorter? | Give me an example. | Why? | Explain the second point in more detail. |
Can you put that in a table? | Summarise that in one sentence. | What would you add? | Now explain it to a child. |
Rewrite that in a more formal tone. | Turn that into a numbered list. | What is the most important part? |
Can you give me three more ideas? | Is there anything wrong with what you said? | Translate that into French. |
How would I explain this to a friend? | Make it funnier. | What are the limits of this? | Continue. |
Give me a quiz question about this. | Can you say that in simpler words?
"""
ZH_FOLLOW_UPS = """
可以再短一點嗎？ | 舉個例子。 | 為什麼？ | 請用表格整理。 | 用一句話總結。 | 再給我三個點子。 | 請翻譯成英文。 | 繼續。
"""


def split_list(text: str, sep: str = "|") -> list[str]:
    """The items of a ``|``-separated block, stripped, empties dropped."""
    return [s.strip() for s in text.split(sep) if s.strip()]


def pairs() -> list[tuple[str, str]]:
    """``PAIRS`` as (a, b) tuples."""
    return [tuple(s.strip() for s in p.split("|")) for p in split_list(PAIRS, ";")]
