"""Rebuild the CPU profile's letter-selection set from facts.json (deterministic).

    python data/letters/make_letters.py

Writes letters.jsonl: one MMLU-schema row per fact (question, subject, choices, answer, split, as
`cais/mmlu` has them, plus `id` and `table`). Distractors are three other answers of the same table
(nearby numbers for arithmetic), the letters shuffled. The first five rows of each subject are its
dev split (lm-eval's few-shot examples); the rest are test. `helpers.tasks.load_letters` reads each
row twice: as an MMLU question (pick the letter) and as a cloze question on the same four answer
texts (know the fact), so both are measured on the same facts, item by item.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
N_DEV = 5
ONES = "zero one two three four five six seven eight nine".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_word(n: int) -> str:
    return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])


def near(answer: int, rng: random.Random) -> list[str]:
    pool = sorted({answer + d for d in (-10, -2, -1, 1, 2, 10)} - {answer})
    return [str(x) for x in rng.sample([x for x in pool if x >= 0], 3)]


def facts(spec: dict, rng: random.Random):
    """(table, subject, question, answer, distractors) for every fact."""
    for table, t in spec["tables"].items():
        values = sorted(set(t["facts"].values()))
        for key, answer in t["facts"].items():
            yield table, t["subject"], t["question"].format(key), answer, rng.sample([v for v in values if v != answer], 3)
    a = spec["arithmetic"]
    operations = {"sums": ("What is {} plus {}?", lambda x, y: x + y, a["sums"]),
                  "products": ("What is {} times {}?", lambda x, y: x * y, a["products"]),
                  "differences": ("What is {} minus {}?", lambda x, y: x - y, a["differences"])}
    for table, (question, op, (low, high)) in operations.items():
        pairs = [(x, y) for x in range(low, high + 1) for y in range(low, high + 1) if op(x, y) > 0]
        for x, y in sorted(rng.sample(pairs, min(a["n_per_operation"], len(pairs)))):
            yield table, a["subject"], question.format(x, y), str(op(x, y)), near(op(x, y), rng)
    w = spec["number_words"]
    for n in range(w["range"][0], w["range"][1] + 1):
        swapped = 10 * (n % 10) + n // 10
        pool = sorted({swapped, n + 1, n - 1, n + 10, n - 10} - {n})
        yield "number_words", w["subject"], w["question"].format(number_word(n)), str(n), [str(x) for x in rng.sample(pool, 3)]


def main() -> None:
    spec = json.loads((HERE / "facts.json").read_text())
    rng = random.Random(0)
    rows, seen = [], {}
    for table, subject, question, answer, distractors in facts(spec, rng):
        choices = distractors[:]
        gold = rng.randrange(4)
        choices.insert(gold, answer)
        seen[subject] = seen.get(subject, 0) + 1
        rows.append({"id": f"{table}-{sum(r['table'] == table for r in rows) + 1}", "table": table, "question": question, "subject": subject,
                     "choices": choices, "answer": gold, "split": "dev" if seen[subject] <= N_DEV else "test"})
    (HERE / "letters.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"letters.jsonl: {len(rows)} rows, {sum(r['split'] == 'test' for r in rows)} test")


if __name__ == "__main__":
    main()
