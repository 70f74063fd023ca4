"""The letter-selection set holds no cue: no rule that looks at the options alone (or at how they
overlap the question) picks the answer more often than chance on the test split.

A model that knows none of the facts could still score above chance on a set where, say, the
answer is the option with the most near neighbours (the old numeric distractors were the answer
+-1, +-2, +-10) or the one that repeats the question's key (Tunisia / Tunis). Each rule below
must not beat chance: the lower end of its 95% interval at or below 25%.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import paths
from helpers.stats import wilson

NUMERIC = {"sums", "products", "differences", "number_words"}
# capitals with two claimants
DISPUTED = {
    "Bolivia",
    "Israel",
    "the Netherlands",
    "Sri Lanka",
    "Tanzania",
}


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_letters", paths.data() / "letters" / "make_letters.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_letters = _generator()
ROWS = [
    json.loads(line)
    for line in (paths.data() / "letters" / "letters.jsonl").read_text().splitlines()
]
TEST = [r for r in ROWS if r["split"] == "test"]
FACTS = json.loads((paths.data() / "letters" / "facts.json").read_text())
KEYS = {t["question"].format(key): key for t in FACTS["tables"].values() for key in t["facts"]}


def key(row: dict) -> str:
    """The part of the question that names the fact (the country, the word, the sum)."""
    return KEYS.get(row["question"], row["question"])


def first_max(values) -> int:
    values = list(values)
    return values.index(max(values))


def first_min(values) -> int:
    values = list(values)
    return values.index(min(values))


def neighbours(row):  # the option with the most others within 1, 2 or 10 of it
    v = [int(c) for c in row["choices"]]
    return first_max(sum(abs(a - b) in (1, 2, 10) for b in v if b != a) for a in v)


def closest_to_mean(row):
    v = [int(c) for c in row["choices"]]
    return first_min(abs(a - sum(v) / len(v)) for a in v)


RULES = {
    "longest option": lambda r: first_max(len(c) for c in r["choices"]),
    "shortest option": lambda r: first_min(len(c) for c in r["choices"]),
    "most shared with the question": lambda r: first_max(
        make_letters.shared_run(c, key(r)) for c in r["choices"]
    ),
    "least shared with the question": lambda r: first_min(
        make_letters.shared_run(c, key(r)) for c in r["choices"]
    ),
    "same first letter as the key": lambda r: first_max(
        c[:1].lower() == key(r)[:1].lower() for c in r["choices"]
    ),
}
NUMERIC_RULES = {
    "most near neighbours": neighbours,
    "closest to the options' mean": closest_to_mean,
    "largest": lambda r: first_max(int(c) for c in r["choices"]),
    "smallest": lambda r: first_min(int(c) for c in r["choices"]),
}
PARTS = {
    "numeric": [r for r in TEST if r["table"] in NUMERIC],
    "words": [r for r in TEST if r["table"] not in NUMERIC],
    "all": TEST,
}


def beats_chance(rule, rows) -> tuple[bool, str]:
    right = sum(rule(r) == r["answer"] for r in rows)
    lo, hi = wilson(right, len(rows))
    return lo > 0.25, f"{right}/{len(rows)} = {right / len(rows):.3f} [{lo:.3f}, {hi:.3f}]"


@pytest.mark.parametrize("part", list(PARTS))
@pytest.mark.parametrize("name", list(RULES))
def test_no_option_rule_beats_chance(name, part):
    beats, evidence = beats_chance(RULES[name], PARTS[part])
    assert not beats, f"'{name}' on the {part} items: {evidence}"


@pytest.mark.parametrize("name", list(NUMERIC_RULES))
def test_no_numeric_rule_beats_chance(name):
    beats, evidence = beats_chance(NUMERIC_RULES[name], PARTS["numeric"])
    assert not beats, f"'{name}' on the numeric items: {evidence}"


def test_the_rules_can_find_a_cue():
    # The old distractors (the answer +-1, +-2, +-10) on the same questions: the neighbour rule wins.
    import random

    rng = random.Random(0)
    rows = []
    for r in PARTS["numeric"]:
        answer = int(r["choices"][r["answer"]])
        choices = [str(answer + d) for d in rng.sample([-10, -2, -1, 1, 2, 10], 3)]
        gold = rng.randrange(4)
        choices.insert(gold, str(answer))
        rows.append({**r, "choices": choices, "answer": gold})
    assert beats_chance(neighbours, rows)[0]
    leaky = [
        {
            "question": "What is the capital of Tunisia?",
            "choices": ["Tunis", "Rabat", "Cairo", "Tripoli"],
            "answer": 0,
        }
    ] * 40
    assert beats_chance(RULES["most shared with the question"], leaky)[0]


def test_no_answer_can_be_read_off_its_question():
    for r in TEST:
        if r["table"] not in NUMERIC:
            answer, distractors = (
                r["choices"][r["answer"]],
                [c for i, c in enumerate(r["choices"]) if i != r["answer"]],
            )
            assert not make_letters.leaks(key(r), answer, distractors), r["question"]


def test_numbers_are_at_most_a_third_and_letters_are_even():
    assert 3 * len(PARTS["numeric"]) <= len(TEST)
    counts = [sum(r["answer"] == g for r in TEST) for g in range(4)]
    assert max(counts) - min(counts) <= 0.02 * len(TEST), counts


def test_disputed_facts_are_not_asked():
    capitals = FACTS["tables"]["capitals"]["facts"]
    assert not DISPUTED & set(capitals)
    assert not [r for r in ROWS if r["table"] == "capitals" and key(r) in DISPUTED]
