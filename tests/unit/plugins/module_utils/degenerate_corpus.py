"""A labelled corpus of model outputs for the degenerate-output check: answers an engine that works gives (prose,
lists, tables, truth tables, code, JSON, YAML, CSV, other scripts) and what broken engines and samplers emit (a
character, a word, a token or a short phrase repeated, a sentence loop, a loop after a good start, a word salad).

Each entry is ``(label, text)``; the labels name the kind of output, so a misclassified sample is easy to find.
"""

from __future__ import annotations

TRUTH_TABLE_AND = """| A | B | A AND B |
|---|---|---------|
| 0 | 0 | 0 |
| 0 | 1 | 0 |
| 1 | 0 | 0 |
| 1 | 1 | 1 |"""

TRUTH_TABLE_MAJORITY = """Here is the truth table for the 3-input majority function:

| A | B | C | Out |
|---|---|---|-----|
| 0 | 0 | 0 | 0 |
| 0 | 0 | 1 | 0 |
| 0 | 1 | 0 | 0 |
| 0 | 1 | 1 | 1 |
| 1 | 0 | 0 | 0 |
| 1 | 0 | 1 | 1 |
| 1 | 1 | 0 | 1 |
| 1 | 1 | 1 | 1 |"""

TRUTH_TABLE_OR = """| A | B | C | A OR B OR C |
|---|---|---|-------------|
| 0 | 0 | 0 | 0 |
| 0 | 0 | 1 | 1 |
| 0 | 1 | 0 | 1 |
| 0 | 1 | 1 | 1 |
| 1 | 0 | 0 | 1 |
| 1 | 0 | 1 | 1 |
| 1 | 1 | 0 | 1 |
| 1 | 1 | 1 | 1 |"""

TRUTH_TABLE_XOR_PLAIN = """A B C D | A XOR B XOR C XOR D
0 0 0 0 | 0
0 0 0 1 | 1
0 0 1 0 | 1
0 0 1 1 | 0
0 1 0 0 | 1
0 1 0 1 | 0
0 1 1 0 | 0
0 1 1 1 | 1
1 0 0 0 | 1
1 0 0 1 | 0
1 0 1 0 | 0
1 0 1 1 | 1
1 1 0 0 | 0
1 1 0 1 | 1
1 1 1 0 | 1
1 1 1 1 | 0"""

CAPITALS_TABLE = """| Country | Capital | Population (millions) |
|---------|---------|-----------------------|
| France | Paris | 68.2 |
| Germany | Berlin | 84.4 |
| Italy | Rome | 58.9 |
| Spain | Madrid | 48.6 |
| Poland | Warsaw | 36.7 |"""

CSV_ROWS = """date,region,requests,errors
2024-05-01,eu-west,182334,12
2024-05-01,us-east,240118,31
2024-05-02,eu-west,179902,9
2024-05-02,us-east,251447,40
2024-05-03,eu-west,185210,11"""

JSON_CONFIG = """{
  "model": "Qwen/Qwen3-8B",
  "tp_size": 2,
  "mem_fraction_static": 0.85,
  "speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1},
  "enable_metrics": true
}"""

JSON_RECORDS = """[
  {"id": 1, "score": 0.91, "rank": 1},
  {"id": 2, "score": 0.87, "rank": 2},
  {"id": 3, "score": 0.85, "rank": 3},
  {"id": 4, "score": 0.80, "rank": 4},
  {"id": 5, "score": 0.78, "rank": 5},
  {"id": 6, "score": 0.74, "rank": 6},
  {"id": 7, "score": 0.70, "rank": 7},
  {"id": 8, "score": 0.66, "rank": 8}
]"""

JSON_FLAGS = """[
  {"service": "api", "enabled": true, "retries": 3, "timeout_s": 30},
  {"service": "worker", "enabled": true, "retries": 3, "timeout_s": 30},
  {"service": "cron", "enabled": false, "retries": 3, "timeout_s": 30},
  {"service": "gateway", "enabled": true, "retries": 3, "timeout_s": 30}
]"""

JSON_ONE_LINE = '{"name": "sglang", "version": "0.5.23", "requires_python": ">=3.11", "license": "Apache-2.0"}'

YAML_MANIFEST = """apiVersion: v1
kind: Service
metadata:
  name: sglang
  labels:
    app: sglang
spec:
  selector:
    app: sglang
  ports:
    - name: http
      port: 30000
      targetPort: 30000"""

PYTHON_CODE = """```python
def primes(count):
    found = []
    candidate = 2
    while len(found) < count:
        if all(candidate % p for p in found):
            found.append(candidate)
        candidate += 1
    return found


print(primes(5))
```"""

PYTHON_CLASS = """class Counter:
    def __init__(self):
        self.count = 0

    def increment(self):
        self.count += 1
        return self.count

    def reset(self):
        self.count = 0"""

JAVASCRIPT_CODE = """function debounce(fn, wait) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), wait);
  };
}"""

SQL_QUERY = """SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
WHERE o.created_at >= '2024-01-01'
GROUP BY c.name
ORDER BY revenue DESC
LIMIT 10;"""

BASH_SCRIPT = """#!/bin/sh
set -eu
for host in gpu1 gpu2 gpu3; do
  ssh "$host" nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
done"""

HTML_SNIPPET = """<ul>
  <li><a href="/docs">Docs</a></li>
  <li><a href="/blog">Blog</a></li>
  <li><a href="/about">About</a></li>
</ul>"""

MULTIPLICATION = """7 x 1 = 7
7 x 2 = 14
7 x 3 = 21
7 x 4 = 28
7 x 5 = 35
7 x 6 = 42
7 x 7 = 49
7 x 8 = 56
7 x 9 = 63
7 x 10 = 70"""

IDENTITY_MATRIX = "The 4 x 4 identity matrix is [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]."

TRACEBACK = """Traceback (most recent call last):
  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2412, in run
    self.event_loop_normal()
  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 1130, in event_loop
    result = self.run_batch(batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."""

PROSE = (
    "A GPU can keep memory allocated after the process that used it has exited, for example when a thread of that "
    "process is stuck inside the driver in uninterruptible sleep. Until the driver finishes the teardown, the memory "
    "shows up as used in nvidia-smi, and a new server that tries to allocate its KV cache fails with an out of memory "
    "error. A reset of the GPU, or a reboot of the host, clears that state."
)

RECIPE = (
    "1. Bring a large pot of salted water to a boil.\n2. Add the spaghetti and cook it for nine minutes.\n"
    "3. Meanwhile, fry the garlic in olive oil until golden.\n4. Drain the pasta and toss it with the garlic oil.\n"
    "5. Season with pepper and serve at once."
)

LYRICS = "Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a dream."

MATH = (
    "We want x such that 3x + 7 = 22. Subtract 7 from both sides: 3x = 15. Divide both sides by 3: x = 5. "
    "Check: 3 * 5 + 7 = 15 + 7 = 22, so x = 5 is correct."
)

GOOD_START = "The first five prime numbers are 2, 3, 5, 7 and 11."

NORMAL = [
    ("short answer, numbers", "2, 3, 5, 7, 11"),
    ("short answer, sentence", GOOD_START),
    ("one word", "Paris"),
    ("one number", "1000"),
    ("prose paragraph", PROSE),
    ("prose with a repeated phrase", "It is what it is, and that is that. Nothing more can be done about it today."),
    ("numbered steps", RECIPE),
    ("bulleted pros and cons", "Pros:\n- fast\n- cheap\n- simple\n\nCons:\n- no MIG support\n- needs a restart"),
    ("yes/no list", "- yes\n- no\n- yes\n- no"),
    ("2-input truth table", TRUTH_TABLE_AND),
    ("3-input truth table with a preamble", TRUTH_TABLE_MAJORITY),
    ("3-input truth table", TRUTH_TABLE_OR),
    ("4-input truth table, plain", TRUTH_TABLE_XOR_PLAIN),
    ("markdown table", CAPITALS_TABLE),
    ("CSV", CSV_ROWS),
    ("JSON object", JSON_CONFIG),
    ("JSON records, numeric values", JSON_RECORDS),
    ("JSON records, repeated values", JSON_FLAGS),
    ("JSON on one line", JSON_ONE_LINE),
    ("YAML manifest", YAML_MANIFEST),
    ("Python in a code fence", PYTHON_CODE),
    ("Python class", PYTHON_CLASS),
    ("JavaScript", JAVASCRIPT_CODE),
    ("SQL", SQL_QUERY),
    ("shell script", BASH_SCRIPT),
    ("HTML", HTML_SNIPPET),
    ("multiplication table", MULTIPLICATION),
    ("identity matrix", IDENTITY_MATRIX),
    ("Python traceback", TRACEBACK),
    ("lyrics with a refrain", LYRICS),
    ("worked arithmetic", MATH),
    ("Chinese prose", "北京是中华人民共和国的首都\uff0c也是全国的政治和文化中心。"),
    ("German prose", "Die ersten fünf Primzahlen sind 2, 3, 5, 7 und 11. Jede davon ist nur durch 1 und sich teilbar."),
    ("heading with underline", "Title\n=====\nSome text below the heading explains it."),
    ("ellipsis", "..."),
    ("short exclamation", "Wow!!"),
]

DEGENERATE = [
    ("one character", "!!!!!!!!"),
    ("one character after a word", "Hello!!!!!!!!"),
    ("one character, long", "!" * 64),
    ("full stops, CJK", "。。。。。。。。。。"),
    ("emoji", "😀😀😀😀😀😀😀😀"),
    ("commas", ", , , , , , , , , , , ,"),
    ("one digit", "0 0 0 0 0 0 0 0 0 0 0 0"),
    ("one word repeated", "the the the the the the the the"),
    ("one word, mixed case and punctuation", "Yes yes YES, yes. Yes! yes"),
    ("one token, no spaces", "HelloHelloHelloHelloHello"),
    ("special token", "<|endoftext|><|endoftext|><|endoftext|><|endoftext|><|endoftext|>"),
    ("subword loop", "Process processing ing ing ing ing ing ing ing ing"),
    ("two words alternating", "no yes no yes no yes no yes no yes"),
    ("short phrase loop", "I am a model and I am a model and I am a model and I am a model and I am a model"),
    ("short phrase loop, trailing word", "I am a model and I am a model and I am a model and I am a model and I, yes"),
    ("sentence loop", " ".join([GOOD_START] * 4)),
    ("question loop", "What is the capital of France? " * 4),
    ("line loop", "Answer:\nAnswer:\nAnswer:\nAnswer:\nAnswer:\nAnswer:"),
    ("loop after a good answer", GOOD_START + " Paris. Paris. Paris. Paris. Paris. Paris. Paris. Paris."),
    ("word loop after a good answer", GOOD_START + " yes yes yes yes yes yes yes yes yes yes yes yes yes yes"),
    ("numbered step loop", "Step 1: Step 1: Step 1: Step 1: Step 1: Step 1:"),
    ("code line loop", "x = 0\nx = x + 1\nx = x + 1\nx = x + 1\nx = x + 1\nx = x + 1\nx = x + 1"),
    ("table row loop", "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 |\n| 1 | 2 |\n| 1 | 2 |\n| 1 | 2 |\n| 1 | 2 |"),
    ("nested JSON loop", '{"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a":'),
    ("CJK token loop", "我是我是我是我是我是我是"),
    ("word salad, small vocabulary", "the of the and of the the and of and the of the and the of a the of and the"),
    ("long loop after a long answer", PROSE + " and then it goes on and on" * 16),
]
