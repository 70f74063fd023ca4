"""Writes the small generative tasks of this folder, in lm-eval's task format (issue 21, item 3).

    python data/lm_eval_tasks/generate.py          # rewrites the .jsonl files beside this script

Deterministic: fixed seeds and fixed word lists, so a rerun rewrites the same bytes (a test checks
it). Each task has a `train` split (the few-shot examples its YAML asks for) and a `test` split:

- `arithmetic_words`: one-step word problems (add, take away, groups of) with small numbers, whose
  answer is a whole number the doc also holds as its operands, so it can be checked;
- `page_field`: one field copied out of a small semi-structured page, as SWDE asks of a web page
  (a film's page with five fields; the question names one, the answer is its value verbatim).

The YAMLs (`arithmetic_words.yaml`, `page_field.yaml`) read these files with `dataset_path: json`;
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


TASKS = {"arithmetic_words": (arithmetic_doc, 2101), "page_field": (page_doc, 2102)}


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
