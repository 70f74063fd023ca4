"""Writes the small generative tasks of this folder, in lm-eval's task format (issue 21, item 3).

    python data/lm_eval_tasks/generate.py          # rewrites the .jsonl files beside this script

Deterministic: fixed seeds and fixed word lists, so a rerun rewrites the same bytes (a test checks
it). Each task has a `train` split (the few-shot examples its YAML asks for) and a `test` split:

- `arithmetic_words`: one-step word problems (add, take away, groups of) with small numbers, whose
  answer is a whole number the doc also holds as its operands, so it can be checked;
- `page_field`: one field copied out of a small semi-structured page, as SWDE asks of a web page
  (a film's page with five fields; the question names one, the answer is its value verbatim);
- `dialogue_fact`: a question about a short dialogue between two people, who settle a place, a
  day, an hour and a thing to bring after one rejected suggestion (the answer is a word of the
  dialogue, the rejected place a distractor);
- `choice_chat`: a four-way question in ARC's shape and lm-eval's `arc_challenge_chat` prompt
  ("Your response should end with ..."), answered by generating the letter after lm-eval's
  `gen_prefix` "The best answer is": which of four things belongs to a category.

The YAMLs (`arithmetic_words.yaml`, `page_field.yaml`, ...) read these files with `dataset_path: json`;
`helpers.lmeval` reads their `data_files` relative to the YAML's folder. Standard library only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SIZES = {"train": 3, "test": 100}

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Leo"]
THINGS = ["apples", "books", "marbles", "pencils", "stickers", "cookies", "stamps", "shells"]


def arithmetic_doc(rng: random.Random) -> dict:
    name, friend = rng.sample(NAMES, 2)
    things = rng.choice(THINGS)
    kind = rng.choice(["add", "take away", "groups of"])
    if kind == "add":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        question, answer = f"{name} has {a} {things}. {friend} gives {name} {b} more. How many {things} does {name} have now?", a + b
    elif kind == "take away":
        a = rng.randint(5, 15)
        b = rng.randint(1, a - 1)
        question, answer = f"{name} has {a} {things} and gives {b} of them to {friend}. How many {things} does {name} have left?", a - b
    else:
        a, b = rng.randint(2, 5), rng.randint(2, 5)
        question, answer = f"{name} has {a} bags with {b} {things} in each bag. How many {things} does {name} have in all?", a * b
    return {"question": question, "answer": str(answer), "operation": kind, "operands": [a, b]}


FIRST = ["Maria", "Tomas", "Elena", "Pavel", "Sofia", "Jan", "Lucia", "Omar", "Nina", "Karl", "Rosa", "Ivan"]
LAST = ["Berg", "Novak", "Santos", "Keller", "Moreau", "Lind", "Costa", "Weber", "Horvat", "Dahl"]
TITLE_WORDS = ["Silver", "River", "Winter", "Garden", "Night", "Harbor", "Glass", "Summer", "Stone", "Letter", "Road", "Bird"]
GENRES = ["Drama", "Comedy", "Thriller", "Documentary", "Western", "Musical"]
COUNTRIES = ["Norway", "Portugal", "Canada", "Japan", "Chile", "Poland", "Kenya", "Italy"]
FIELDS = ["Director", "Year", "Genre", "Country", "Runtime"]


def page_doc(rng: random.Random) -> dict:
    title = " ".join(["The"] + rng.sample(TITLE_WORDS, 2))
    values = {"Director": f"{rng.choice(FIRST)} {rng.choice(LAST)}", "Year": str(rng.randint(1950, 2020)),
              "Genre": rng.choice(GENRES), "Country": rng.choice(COUNTRIES), "Runtime": f"{rng.randint(80, 160)} min"}
    order = rng.sample(FIELDS, len(FIELDS))  # the field asked for sits anywhere on the page
    lines = [f"<h1>{title}</h1>"] + [f'<div class="field">{f}: {values[f]}</div>' for f in order]
    field = rng.choice(FIELDS)
    return {"page": "\n".join(lines), "field": field, "answer": values[field]}


PLACES = ["station", "library", "park", "museum", "bakery", "harbour", "cinema", "market"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def dialogue_doc(rng: random.Random) -> dict:
    a, b = rng.sample(NAMES, 2)
    place, rejected = rng.sample(PLACES, 2)
    day, thing, hour = rng.choice(DAYS), rng.choice(THINGS), rng.randint(2, 9)
    lines = [f"{a}: Are we still meeting on {day}?", f"{b}: Yes. How about the {rejected}?",
             f"{a}: No, the {place} is better.", f"{b}: Fine. Should I bring the {thing}?",
             f"{a}: Yes, and come at {hour} o'clock."]
    question, answer = rng.choice([("Where will they meet?", place), ("On which day will they meet?", day),
                                   (f"What will {b} bring?", thing), ("At what hour will they meet?", str(hour))])
    return {"dialogue": "\n".join(lines), "question": question, "answer": answer}


# No word belongs to two categories (no "orange", "peach", "silver" or "copper", which name colours too).
CATEGORIES = {
    "a fruit": ["apple", "banana", "grape", "mango", "pear", "kiwi", "melon", "apricot"],
    "an animal": ["horse", "rabbit", "tiger", "eagle", "salmon", "camel", "wolf", "frog"],
    "a colour": ["red", "green", "blue", "yellow", "purple", "grey", "black", "white"],
    "a musical instrument": ["violin", "piano", "guitar", "flute", "trumpet", "drum", "cello", "harp"],
    "a metal": ["iron", "zinc", "tin", "nickel", "cobalt", "tungsten", "magnesium", "titanium"],
    "a tool": ["hammer", "saw", "wrench", "drill", "chisel", "shovel", "rake", "pliers"],
}


def choice_doc(rng: random.Random) -> dict:
    """ARC's fields (`question`, `choices` with `text` and `label`, `answerKey`), as lm-eval's
    arc_challenge_chat reads them. The three wrong options come from three other categories, so
    exactly one option belongs."""
    category = rng.choice(sorted(CATEGORIES))
    others = rng.sample([c for c in sorted(CATEGORIES) if c != category], 3)
    options = [rng.choice(CATEGORIES[category])] + [rng.choice(CATEGORIES[c]) for c in others]
    order = rng.sample(range(4), 4)
    texts = [options[i] for i in order]
    return {"id": f"choice-{category.split()[-1]}-{texts[0]}-{texts[1]}-{texts[2]}-{texts[3]}",
            "question": f"Which of the following is {category}?",
            "choices": {"text": texts, "label": list("ABCD")}, "answerKey": "ABCD"[order.index(0)]}


TASKS = {"arithmetic_words": (arithmetic_doc, 2101), "page_field": (page_doc, 2102),
         "dialogue_fact": (dialogue_doc, 2103), "choice_chat": (choice_doc, 2104)}


def docs(task: str) -> dict[str, list[dict]]:
    """Each split's docs; the test split never repeats a train doc's question."""
    make, seed = TASKS[task]
    rng, seen, out = random.Random(seed), set(), {}
    for split, n in SIZES.items():
        out[split] = []
        while len(out[split]) < n:
            doc = make(rng)
            key = json.dumps(doc, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out[split].append(doc)
    return out


def write(folder: Path = HERE) -> list[Path]:
    written = []
    for task in TASKS:
        for split, rows in docs(task).items():
            path = folder / f"{task}-{split}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            written.append(path)
    return written


if __name__ == "__main__":
    for path in write():
        print(path)
