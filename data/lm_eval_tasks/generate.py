"""Writes the small generative tasks of this folder, in lm-eval's task format (issue 21, item 3).

    python data/lm_eval_tasks/generate.py          # rewrites the .jsonl files beside this script

Deterministic: fixed seeds and fixed word lists, so a rerun rewrites the same bytes (a test checks
it). Each task has a `train` split (the few-shot examples its YAML asks for) and a `test` split:

- `arithmetic_words`: three people's counts of two things, and a question that needs two of the
  six (one gives the other all of a thing, or how many more one has); a worked solution and the
  whole-number answer, with the two counts as its operands, so it can be checked;
- `page_field`: one cell copied out of a listing page, as SWDE asks of a web page (an HTML table
  of four films; the question names a column and a film by its director, whose first and last
  names each recur on the page; the answer is the cell verbatim);
- `dialogue_fact`: a question about a short dialogue between two people, who settle a place, a
  day, an hour and a thing to bring after one rejected suggestion (the answer is a word of the
  dialogue, the rejected place a distractor);
- `choice_chat`: a four-way question in ARC's shape for lm-eval's `arc_challenge_chat` prompt
  ("Your response should end with ..."), answered by generating the letter after lm-eval's
  `gen_prefix` "The best answer is": a question of the book's letter set (data/letters).

Each was tried on Qwen2.5-Coder-1.5B-Instruct before its answers were fixed (the comments below
say what easier forms gave): a task at its ceiling cannot show a fall.

The YAMLs (`arithmetic_words.yaml`, `page_field.yaml`, ...) read these files with `dataset_path: json`;
`helpers.lmeval` reads their `data_files` relative to the YAML's folder. Standard library only.
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
SIZES = {"train": 3, "test": 100}

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Leo"]
THINGS = ["apples", "books", "marbles", "pencils", "stickers", "cookies", "stamps", "shells"]


# GSM8K's problems take several facts from their text; here three people's counts of two things
# are stated, and the question needs two of the six (one step on numbers below 16 with nothing to
# look up left Qwen2.5-Coder-1.5B at 100%, a task that cannot show a fall, and so did two steps of
# two-digit arithmetic worked out). As in GSM8K, a solution works the steps before the answer.
PAIRS = [("apples", "pears"), ("books", "pencils"), ("marbles", "stickers"), ("cookies", "stamps"),
         ("shells", "coins")]


def arithmetic_doc(rng: random.Random) -> dict:
    people = rng.sample(NAMES, 3)
    kinds = rng.choice(PAIRS)
    counts = {(p, k): rng.randint(11, 60) for p in people for k in kinds}
    facts = " ".join(f"{p} has {counts[p, kinds[0]]} {kinds[0]} and {counts[p, kinds[1]]} {kinds[1]}." for p in people)
    giver, taker = rng.sample(people, 2)
    thing = rng.choice(kinds)
    x, y = counts[taker, thing], counts[giver, thing]
    if rng.random() < 0.5:
        question = f"{facts} {giver} gives {taker} all of {giver}'s {thing}. How many {thing} does {taker} have now?"
        operation, answer, sign = "add", x + y, "+"
    else:
        if x == y:
            return arithmetic_doc(rng)
        (taker, x), (giver, y) = sorted([(taker, x), (giver, y)], key=lambda pair: -pair[1])
        question = f"{facts} How many more {thing} does {taker} have than {giver}?"
        operation, answer, sign = "take away", x - y, "-"
    solution = (f"{taker} has {x} {thing}. {giver} has {y} {thing}. {x} {sign} {y} = {answer}. "
                f"The answer is {answer}.")
    return {"question": question, "answer": str(answer), "solution": solution, "operation": operation,
            "operands": [x, y]}


FIRST = ["Maria", "Tomas", "Elena", "Pavel", "Sofia", "Jan", "Lucia", "Omar", "Nina", "Karl", "Rosa", "Ivan"]
LAST = ["Berg", "Novak", "Santos", "Keller", "Moreau", "Lind", "Costa", "Weber", "Horvat", "Dahl"]
TITLE_WORDS = ["Silver", "River", "Winter", "Garden", "Night", "Harbor", "Glass", "Summer", "Stone", "Letter", "Road", "Bird"]
GENRES = ["Drama", "Comedy", "Thriller", "Documentary", "Western", "Musical"]
COUNTRIES = ["Norway", "Portugal", "Canada", "Japan", "Chile", "Poland", "Kenya", "Italy"]
COLUMNS = ["Director", "Year", "Country"]
ROWS = 4  # films on a page, one cell asked for: two first names x two last names of directors


def page_doc(rng: random.Random) -> dict:
    """A listing page of ROWS films; the question names a film by its director and asks another
    column of its row, the answer is that cell verbatim. Within a page titles and every column's
    values are distinct, so the cell's value alone does not tell which row was asked for."""
    titles = _distinct(rng, lambda: " ".join(["The"] + rng.sample(TITLE_WORDS, 2)))
    # Every director shares a first name with one other and a last name with another: the row is
    # found by the whole name (one film on a page, or distinct names, left the model at 100%).
    firsts, lasts = rng.sample(FIRST, 2), rng.sample(LAST, 2)
    directors = [f"{f} {l}" for f in firsts for l in lasts]
    rng.shuffle(directors)
    columns = {"Director": directors,
               "Year": _distinct(rng, lambda: str(rng.randint(1950, 2020))),
               "Country": _distinct(rng, lambda: rng.choice(COUNTRIES))}
    cells = lambda values: "".join(f"<td>{v}</td>" for v in values)
    lines = ["<table>", f"<tr><th>Title</th>{cells(COLUMNS).replace('td>', 'th>')}</tr>"]
    lines += [f"<tr>{cells([t] + [columns[c][i] for c in COLUMNS])}</tr>" for i, t in enumerate(titles)]
    columns["Title"] = titles
    row, column = rng.randrange(ROWS), rng.choice(["Title"] + [c for c in COLUMNS if c != "Director"])
    return {"page": "\n".join(lines + ["</table>"]), "field": f"{column} of the film by {columns['Director'][row]}",
            "answer": columns[column][row]}


def _distinct(rng: random.Random, draw) -> list[str]:
    values: list[str] = []
    while len(values) < ROWS:
        if (value := draw()) not in values:
            values.append(value)
    return values


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


LETTERS = HERE.parent / "letters" / "letters.jsonl"  # the book's letter set (data/letters)


@cache
def letter_questions() -> tuple[dict, ...]:
    rows = (json.loads(line) for line in LETTERS.read_text().splitlines() if line.strip())
    return tuple(r for r in rows if r["split"] == "test")


def choice_doc(rng: random.Random) -> dict:
    """ARC's fields (`id`, `question`, `choices` with `text` and `label`, `answerKey`), as lm-eval's
    arc_challenge_chat reads them, for a question of the letter set's test split (the cue-free
    options of data/letters). Four things of which one belongs to a category were answered at
    100%: a task at ceiling cannot show a fall."""
    r = rng.choice(letter_questions())
    return {"id": r["id"], "question": r["question"], "choices": {"text": r["choices"], "label": list("ABCD")},
            "answerKey": "ABCD"[r["answer"]]}


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
