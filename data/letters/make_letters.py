"""Rebuild the CPU profile's letter-selection set from facts.json (deterministic).

    python data/letters/make_letters.py

Writes letters.jsonl: one MMLU-schema row per fact (question, subject, choices, answer, split, as
`cais/mmlu` has them, plus `id` and `table`). The first five rows of each subject are its dev
split (lm-eval's few-shot examples); the rest are test. `helpers.tasks.load_letters` reads each
row twice: as an MMLU question (pick the letter) and as a cloze question on the same four answer
texts (know the fact), so both are measured on the same facts, item by item.

The set is built so that the answer cannot be found without the fact (tests/test_letters.py
scores simple option-counting rules on the test split and requires each to be at chance):

- Distractors of a fact table are three other answers of the same table, those with the
  answer's first letter where the table has them (`look_alikes`). A fact whose answer
  can be read off its question is left out: the answer shares a run of at least two letters
  with the question's key (Tunisia / Tunis, drink / drank) that no distractor shares as long.
- Numbers (arithmetic, number words) get four options of one of a few shapes (offsets such as
  0, 1, 2, 10), the answer at a uniformly drawn place in the shape: options near the answer
  would make "the option with the most neighbours" a rule that needs no arithmetic.
- Numeric facts are at most a third of the set; the gold letter cycles evenly over A-D within
  each table (shuffled), so no letter is favoured.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
N_DEV = 5
ONES = "zero one two three four five six seven eight nine".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# Relative positions of four numeric options; the answer takes one of the four at random.
SHAPES = [(0, 1, 2, 3), (0, 1, 2, 10), (0, 1, 10, 11), (0, 2, 4, 6), (0, 1, 3, 10), (0, 10, 20, 30), (0, 2, 10, 12)]
SMALLEST = 1 + max(max(s) for s in SHAPES)  # the smallest numeric answer
LEAK = 2  # letters in a row shared by answer and key that count as reading the answer off the question


def number_word(n: int) -> str:
    return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])


def shared_run(a: str, b: str) -> int:
    """The longest run of letters that `a` and `b` share (case ignored)."""
    a, b = a.lower(), b.lower()
    return max((k for i in range(len(a)) for k in range(1, len(a) - i + 1) if a[i:i + k] in b), default=0)


def leaks(key: str, answer: str, distractors: list[str]) -> bool:
    """Whether the answer can be read off the question: it shares more of the key than any
    distractor does, and at least LEAK letters in a row."""
    run = shared_run(answer, key)
    return run >= LEAK and run > max(shared_run(d, key) for d in distractors)


def numeric_options(answer: int, rng: random.Random) -> list[int]:
    """Three distractors: a shape drawn from SHAPES (mirrored at random), the answer at a
    uniformly drawn place in it. Answers are at least SMALLEST, so every option is positive
    whatever the place: resampling the place for small answers would favour the smallest option."""
    assert answer >= SMALLEST
    sign = rng.choice((1, -1))
    shape = [sign * s for s in rng.choice(SHAPES)]
    place = rng.randrange(4)
    return [answer - shape[place] + s for s in shape if s != shape[place]]


def look_alikes(answer: str, others: list[str], rng: random.Random) -> list[str]:
    """Three distractors from `others`, those that start as the answer does first (carbon: C,
    Ca, Co, Cr), so that an option's first letter says nothing the others do not."""
    alike = [o for o in others if o[0].lower() == answer[0].lower()]
    rest = [o for o in others if o not in alike]
    picked = rng.sample(alike, min(3, len(alike)))
    return picked + rng.sample(rest, 3 - len(picked))


def facts(spec: dict, rng: random.Random):
    """(table, subject, question, answer, distractors) for every fact kept."""
    for table, t in spec["tables"].items():
        values = sorted(set(t["facts"].values()))
        for key, answer in t["facts"].items():
            distractors = look_alikes(answer, [v for v in values if v != answer], rng)
            if not leaks(key, answer, distractors):
                yield table, t["subject"], t["question"].format(key), answer, distractors
    a = spec["arithmetic"]
    operations = {"sums": ("What is {} plus {}?", lambda x, y: x + y, a["sums"]),
                  "products": ("What is {} times {}?", lambda x, y: x * y, a["products"]),
                  "differences": ("What is {} minus {}?", lambda x, y: x - y, a["differences"])}
    for table, (question, op, (low, high)) in operations.items():
        pairs = [(x, y) for x in range(low, high + 1) for y in range(low, high + 1) if op(x, y) >= SMALLEST]
        for x, y in sorted(rng.sample(pairs, min(a["n_per_operation"], len(pairs)))):
            yield table, a["subject"], question.format(x, y), str(op(x, y)), [str(d) for d in numeric_options(op(x, y), rng)]
    w = spec["number_words"]
    for n in sorted(rng.sample(range(max(SMALLEST, w["range"][0]), w["range"][1] + 1), w["n"])):
        yield "number_words", w["subject"], w["question"].format(number_word(n)), str(n), [str(d) for d in numeric_options(n, rng)]


def main() -> None:
    spec = json.loads((HERE / "facts.json").read_text())
    rng = random.Random(0)
    kept = list(facts(spec, rng))
    golds: dict[str, list[int]] = {}  # per table, the gold letters still to hand out: each letter in turn
    rows, seen = [], {}
    for table, subject, question, answer, distractors in kept:
        if not golds.get(table):
            golds[table] = rng.sample(range(4), 4)
        gold = golds[table].pop()
        choices = distractors[:]
        rng.shuffle(choices)
        choices.insert(gold, answer)
        seen[subject] = seen.get(subject, 0) + 1
        rows.append({"id": f"{table}-{sum(r['table'] == table for r in rows) + 1}", "table": table, "question": question,
                     "subject": subject, "choices": choices, "answer": gold,
                     "split": "dev" if seen[subject] <= N_DEV else "test"})
    (HERE / "letters.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"letters.jsonl: {len(rows)} rows, {sum(r['split'] == 'test' for r in rows)} test")


if __name__ == "__main__":
    main()
