"""Our prompts are lm-eval's: each is compared with what lm-eval 0.4 itself builds from its own
task YAMLs, run offline on local rows."""

import json

import pytest
from lmeval import requests, task

from helpers import paths, tasks
from helpers.errors import ConfigError


def fixture_rows(name):
    return [json.loads(l) for l in (paths.data() / "fixtures" / name).read_text().splitlines()]


@pytest.mark.parametrize("k", [0, 5])
def test_mmlu_prompt_is_lm_evals(tmp_path, k):
    rows = [r for r in fixture_rows("mmlu.jsonl") if r["subject"] == "high_school_chemistry"]
    test = [r for r in rows if r["split"] == "test"]
    dev = [r for r in rows if r["split"] == "dev"]
    t = task(
        "mmlu/default/_default_template_yaml",
        {"test": test, "dev": dev},
        tmp_path,
        task="fixture_mmlu",
        test_split="test",
        fewshot_split="dev",
        description=tasks.mmlu_description("high_school_chemistry"),
    )
    ours = tasks.mmlu_items(test, dev, k)
    for doc, item in zip(test[:5], ours):
        assert list(item.pairs) == requests(t, doc, k)
        assert item.gold == doc["answer"]
    assert "\n\n" in ours[0].pairs[0][0] if k else True


def test_mmlu_needs_enough_dev_rows():
    rows = fixture_rows("mmlu.jsonl")
    with pytest.raises(
        ConfigError,
        match=r"k_shot=5, but subject '.+' has \d solved examples \(dev rows\): set k_shot to at most \d",
    ):
        tasks.mmlu_items(rows[:1], rows[:2], k=5)


def test_the_letter_sets_size_and_most_shots_are_read_from_data_without_a_model():
    assert tasks.letter_set_size() == len(tasks.load_letters()[0])
    most = tasks.most_shots("cpu")
    tasks.load_letters(k=most)  # every subject gives that many
    with pytest.raises(ConfigError, match=f"set k_shot to at most {most}"):
        tasks.load_letters(k=most + 1)
    assert tasks.most_shots("paper") is None  # the hub's MMLU: counted when read


KNOWLEDGE_DOCS = {
    "arc_easy": (
        "arc/arc_easy.yaml",
        {
            "id": "x",
            "question": "Which gas do plants absorb?",
            "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["A", "B", "C"]},
            "answerKey": "B",
        },
    ),
    "piqa": (
        "piqa/piqa.yaml",
        {"goal": "To dry wet hair,", "sol1": "use a towel.", "sol2": "use a spoon.", "label": 0},
    ),
    "openbookqa": (
        "openbookqa/openbookqa.yaml",
        {
            "id": "y",
            "question_stem": "The moon orbits",
            "choices": {
                "text": ["the Earth", "a comet", "Mars", "a cloud"],
                "label": ["A", "B", "C", "D"],
            },
            "answerKey": "A",
        },
    ),
    "hellaswag": (
        "hellaswag/hellaswag.yaml",
        {
            "ind": 1,
            "activity_label": "Baking cookies",
            "ctx_a": "A man mixes flour and sugar in a bowl.",
            "ctx_b": "he",
            "ctx": "",
            "endings": [
                "puts the tray in the oven [title] then waits.",
                "eats the bowl.",
                "paints the wall.",
                "sings a song.",
            ],
            "source_id": "s",
            "split": "val",
            "split_type": "indomain",
            "label": "0",
        },
    ),
    "winogrande": (
        "winogrande/default.yaml",
        {
            "sentence": "The cup fell off the table because _ was wobbly.",
            "option1": "the cup",
            "option2": "the table",
            "answer": "2",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWLEDGE_DOCS))
def test_knowledge_prompts_are_lm_evals(tmp_path, name):
    path, doc = KNOWLEDGE_DOCS[name]
    t = task(path, {"validation": [doc]}, tmp_path, validation_split="validation", test_split=None)
    doc = next(iter(t.validation_docs()))  # after lm-eval's own process_docs
    item = tasks.knowledge_item(name, KNOWLEDGE_DOCS[name][1])
    assert list(item.pairs) == requests(t, doc)
    # Winogrande's partial scoring swaps the roles: its gold index is what doc_to_text returns.
    gold = t.doc_to_text(doc) if name == "winogrande" else t.doc_to_target(doc)
    assert item.gold == gold


def test_cpu_knowledge_is_the_letter_sets_facts_in_arcs_prompt_drawn_as_mmlu_is():
    knowledge = tasks.load_knowledge("cpu", n=20, seed=4)
    assert list(knowledge) == [tasks.CPU_KNOWLEDGE]
    cloze, letters = knowledge[tasks.CPU_KNOWLEDGE], tasks.load_mmlu("cpu", n=20, seed=4)
    item = tasks.load_knowledge("cpu")[tasks.CPU_KNOWLEDGE][0]
    assert item.pairs[item.gold] == ("Question: What is the capital of Russia?\nAnswer:", " Moscow")
    for fact, mcq in zip(cloze, letters):  # the same facts, item by item
        assert (
            fact.pairs[0][0].split("\n")[0].removeprefix("Question: ") in mcq.pairs[0][0]
            and fact.gold == mcq.gold
        )


def test_unknown_knowledge_task_lists_known():
    with pytest.raises(KeyError, match="arc_easy"):
        tasks.knowledge_item("trivia", {})


def test_kv_items_are_seeded_and_extend():
    a = tasks.kv_items(6, 5, seed=3)
    assert a == tasks.kv_items(6, 5, seed=3)
    assert tasks.kv_items(6, 8, seed=3)[:5] == a
    assert a != tasks.kv_items(6, 5, seed=4)


def test_kv_item_format():
    item = tasks.kv_items(4, 1, seed=0)[0]
    ctx = item.pairs[0][0]
    lines = ctx.split("\n")
    assert lines[0] == "Memorize the following dictionary:"
    pairs = [l.split(":") for l in lines[1:5]]
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    assert len(set(values)) == 4 and all(0 <= int(v) < 100 for v in values)
    assert lines[5] == f"The value of the key '{keys[item.gold]}' is"
    assert [c for _, c in item.pairs] == values and not item.verbatim  # released: "is42"
    spaced = tasks.kv_items(4, 1, seed=0, form="spaced")[0]
    assert spaced.pairs[0][0] == ctx and [c for _, c in spaced.pairs] == [f" {v}" for v in values]
    trailing = tasks.kv_items(4, 1, seed=0, form="trailing")[0]
    assert (
        trailing.verbatim
        and trailing.pairs[0][0] == ctx + " "
        and trailing.pairs[0][1] == values[0]
    )
    repeat = tasks.kv_items(4, 1, seed=0, query="repeat")[0]
    assert (
        repeat.pairs[0][0].endswith(f"\n{keys[repeat.gold]}:") and repeat.pairs[0][1] == values[0]
    )
    with pytest.raises(
        ValueError, match="unknown KV form 'spaces'; use one of 'released', 'spaced', 'trailing'"
    ):
        tasks.kv_items(4, 1, form="spaces")


def test_kv_rejects_bad_sizes():
    with pytest.raises(ValueError, match="1..100"):
        tasks.kv_items(101, 1)
    with pytest.raises(ValueError, match="'paper' or 'repeat'"):
        tasks.kv_items(3, 1, query="nope")


def test_fixture_subsets_are_seeded():
    assert tasks.load_mmlu("cpu", n=10, seed=1) == tasks.load_mmlu("cpu", n=10, seed=1)
    assert len(tasks.load_mmlu("cpu", n=10)) == 10


def letter_rows():
    return [
        json.loads(l) for l in (paths.data() / "letters" / "letters.jsonl").read_text().splitlines()
    ]


@pytest.mark.parametrize("k", [0, 5])
def test_letters_set_is_in_lm_evals_mmlu_and_arc_prompts(tmp_path, k):
    rows = letter_rows()
    subject = "elementary_mathematics"
    test = [r for r in rows if r["subject"] == subject and r["split"] == "test"]
    dev = [r for r in rows if r["subject"] == subject and r["split"] == "dev"]
    mmlu = task(
        "mmlu/default/_default_template_yaml",
        {"test": test, "dev": dev},
        tmp_path,
        task="letters_mmlu",
        test_split="test",
        fewshot_split="dev",
        description=tasks.mmlu_description(subject),
    )
    letters, cloze = tasks.load_letters(k=k)
    every_test = [r for r in rows if r["split"] == "test"]
    arc_docs = {
        "test": [
            {
                "id": r["id"],
                "question": r["question"],
                "answerKey": "ABCD"[r["answer"]],
                "choices": {"text": r["choices"], "label": list("ABCD")},
            }
            for r in test
        ]
    }
    (tmp_path / "arc").mkdir()
    arc = task(
        "arc/arc_easy.yaml", arc_docs, tmp_path / "arc", task="letters_cloze", test_split="test"
    )
    for doc, arc_doc in list(zip(test, arc_docs["test"]))[:5]:
        i = every_test.index(doc)
        assert list(letters[i].pairs) == requests(mmlu, doc, k) and letters[i].gold == doc["answer"]
        assert list(cloze[i].pairs) == requests(arc, arc_doc, 0) and cloze[i].gold == doc["answer"]


def test_letters_set_pairs_each_question_with_its_cloze_and_is_big_enough():
    letters, cloze = tasks.load_letters()
    # head zeroing: a screen of 100 and a check of 500, disjoint
    assert len(letters) == len(cloze) >= 700
    for mcq, fact in zip(letters, cloze):
        assert (
            mcq.gold == fact.gold
            and fact.pairs[0][0].removeprefix("Question: ").removesuffix("\nAnswer:")
            in mcq.pairs[0][0]
        )
    sub_letters, sub_cloze = tasks.load_letters(n=50, seed=3)
    assert [c.pairs for c in sub_cloze] == [cloze[letters.index(m)].pairs for m in sub_letters]
    golds = [it.gold for it in letters]
    assert min(golds.count(g) for g in range(4)) > 0.2 * len(golds)  # letters spread over A-D


def test_letters_generator_rebuilds_the_committed_file(tmp_path):
    import shutil
    import subprocess
    import sys

    for name in ("make_letters.py", "facts.json"):
        shutil.copy(paths.data() / "letters" / name, tmp_path / name)
    subprocess.run(
        [sys.executable, str(tmp_path / "make_letters.py")], check=True, capture_output=True
    )
    assert (tmp_path / "letters.jsonl").read_bytes() == (
        paths.data() / "letters" / "letters.jsonl"
    ).read_bytes()
