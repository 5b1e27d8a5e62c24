# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prompts for sglang_bench: a fixed, shipped set and seeded random prompts of a given length.

Private to the llmops.inference collection; not a public API. Standard library only.
Both sources are deterministic: the same options give the same prompts on every host and run, so
numbers from different hosts and different sweep points compare like with like.
"""

from __future__ import annotations

import random

# Mixed lengths and kinds (explanation, code, lists, summaries): speculative decoding accepts more
# drafted tokens on predictable text, so a set of one kind would flatter or punish it.
BUILTIN_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "List the planets of the solar system in order from the sun, one per line.",
    "Summarise the plot of Romeo and Juliet for a ten-year-old.",
    "What is the difference between a process and a thread? Answer in a short paragraph.",
    "Translate into French: The meeting has been moved to Thursday afternoon because of the holiday.",
    "Give five tips for writing readable commit messages.",
    "Describe how a hash map handles collisions, with one example of open addressing and one of chaining.",
    "Write a haiku about a server room at night.",
    "Explain what a GPU's memory bandwidth limits during the decode phase of a large language model.",
    "Convert 72 degrees Fahrenheit to Celsius and show the steps.",
    "Write a SQL query that returns the ten customers with the highest total order value in 2024.",
    "What are the main causes of the French Revolution? Give four, each in one sentence.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "Explain the CAP theorem to a new backend engineer, with one real-world example for each trade-off.",
    "Draft a polite email asking a colleague to review a pull request by Friday.",
    "Name three sorting algorithms and give the average time complexity of each.",
    "Describe the water cycle, step by step.",
    "Write a short story opening, two sentences, set on a train crossing the desert.",
    "Why does TCP need a three-way handshake? Explain briefly.",
    "Give a recipe for a simple tomato soup with a list of ingredients and numbered steps.",
    "Explain what systemd's KillMode=control-group does when a service is stopped.",
    "Write a JSON object describing a book with title, author, year and a list of three tags.",
    "What is speculative decoding in language model inference, and why can it speed up generation?",
)

# Plain words for random prompts: common English, so a real tokenizer maps most of them to one token.
RANDOM_WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death experience effect"
).split()


def builtin_prompts(count: int) -> list:
    """``count`` prompts from the shipped set, cycling through it in order."""
    return [BUILTIN_PROMPTS[index % len(BUILTIN_PROMPTS)] for index in range(count)]


def random_prompts(count: int, input_len: int, seed: int) -> list:
    """``count`` prompts of ``input_len`` words each, drawn from a generator seeded with ``seed``.

    Every prompt starts with a different request number, so a server's prefix cache cannot serve one
    prompt from another.
    """
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        words = [rng.choice(RANDOM_WORDS) for _word in range(max(input_len - 1, 0))]
        prompts.append(" ".join([f"{index}:", *words]))
    return prompts
